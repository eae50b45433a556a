// The OpenAPI 3.0 document of the HTTP API (GET /openapi.json): exactly the
// routes and fields that http_server.cc and openai_api.cc implement. Kept in
// one place so that tests/http (schemathesis) checks the server against it.
#include <cstdint>
#include <string>

#include "absl/strings/str_replace.h"
#include "runtime/frontend/openai_api.h"

namespace pagedserve::openai {
namespace {

constexpr char kDocument[] = R"json({
  "openapi": "3.0.3",
  "info": {"title": "pagedserve OpenAI-compatible API", "version": "@VERSION@"},
  "components": {
    "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
    "schemas": {
      "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "object",
        "required": ["message", "type"], "properties": {"message": {"type": "string"},
        "type": {"type": "string"}, "param": {"type": "string", "nullable": true},
        "code": {"type": "string", "nullable": true}}}}},
      "Stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 16}],
               "nullable": true},
      "Sampling": {"type": "object", "properties": {
        "model": {"type": "string"},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 2147483647, "nullable": true},
        "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": 2147483647, "nullable": true},
        "n": {"type": "integer", "minimum": 1, "maximum": 64},
        "stop": {"$ref": "#/components/schemas/Stop"},
        "temperature": {"type": "number", "minimum": 0},
        "top_p": {"type": "number", "exclusiveMinimum": true, "minimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": -1, "maximum": 2147483647},
        "min_p": {"type": "number", "minimum": 0, "maximum": 1},
        "seed": {"type": "integer", "nullable": true},
        "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "repetition_penalty": {"type": "number", "exclusiveMinimum": true, "minimum": 0},
        "ignore_eos": {"type": "boolean"},
        "stop_token_ids": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": @VOCAB_MAX@}},
        "use_beam_search": {"type": "boolean"},
        "best_of": {"type": "integer", "minimum": 1, "maximum": 10, "nullable": true},
        "length_penalty": {"type": "number"},
        "early_stopping": {"oneOf": [{"type": "boolean"}, {"type": "string", "enum": ["never"]}]},
        "user": {"type": "string"},
        "cache_salt": {"type": "string", "minLength": 1, "maxLength": 256, "pattern": "^[!-~]+$",
                       "nullable": true},
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "nullable": true,
                           "properties": {"include_usage": {"type": "boolean"}}}}},
      "Usage": {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
        "properties": {"prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"},
          "total_tokens": {"type": "integer"},
          "prompt_tokens_details": {"type": "object", "properties": {"cached_tokens": {"type": "integer"}}}}},
      "CompletionRequest": {"allOf": [{"$ref": "#/components/schemas/Sampling"}, {"type": "object",
        "required": ["prompt"], "properties": {
          "prompt": {"oneOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1, "maxItems": 64,
                                "items": {"type": "string", "minLength": 1}},
                               {"type": "array", "minItems": 1,
                                "items": {"type": "integer", "minimum": 0, "maximum": @VOCAB_MAX@}}]},
          "logprobs": {"type": "integer", "minimum": 0, "maximum": 20, "nullable": true}}}]},
      "ChatMessage": {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant"]},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object",
          "required": ["type", "text"], "properties": {"type": {"type": "string", "enum": ["text"]},
          "text": {"type": "string"}}}}]}}},
      "ChatRequest": {"allOf": [{"$ref": "#/components/schemas/Sampling"}, {"type": "object",
        "required": ["messages"], "properties": {
          "messages": {"type": "array", "minItems": 1,
                       "items": {"$ref": "#/components/schemas/ChatMessage"}},
          "logprobs": {"type": "boolean"},
          "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20}}}]},
      "Completion": {"type": "object", "required": ["id", "object", "created", "model", "choices"],
        "properties": {"id": {"type": "string"}, "object": {"type": "string"}, "created": {"type": "integer"},
          "model": {"type": "string"}, "choices": {"type": "array", "items": {"type": "object"}},
          "usage": {"$ref": "#/components/schemas/Usage"}}}
    },
    "responses": {
      "Error": {"description": "OpenAI error object",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    }
  },
  "paths": {
    "/v1/completions": {"post": {"operationId": "createCompletion", "security": [{"bearer": []}, {}],
      "requestBody": {"required": true, "content": {"application/json": {"schema":
        {"$ref": "#/components/schemas/CompletionRequest"}}}},
      "responses": {"200": {"description": "completion (JSON) or a stream of server-sent events",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Completion"}},
                    "text/event-stream": {"schema": {"type": "string"}}}},
        "400": {"$ref": "#/components/responses/Error"}, "401": {"$ref": "#/components/responses/Error"},
        "404": {"$ref": "#/components/responses/Error"}, "413": {"$ref": "#/components/responses/Error"},
        "429": {"$ref": "#/components/responses/Error"}, "503": {"$ref": "#/components/responses/Error"}}}},
    "/v1/chat/completions": {"post": {"operationId": "createChatCompletion", "security": [{"bearer": []}, {}],
      "requestBody": {"required": true, "content": {"application/json": {"schema":
        {"$ref": "#/components/schemas/ChatRequest"}}}},
      "responses": {"200": {"description": "chat completion (JSON) or a stream of server-sent events",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Completion"}},
                    "text/event-stream": {"schema": {"type": "string"}}}},
        "400": {"$ref": "#/components/responses/Error"}, "401": {"$ref": "#/components/responses/Error"},
        "404": {"$ref": "#/components/responses/Error"}, "413": {"$ref": "#/components/responses/Error"},
        "429": {"$ref": "#/components/responses/Error"}, "503": {"$ref": "#/components/responses/Error"}}}},
    "/v1/models": {"get": {"operationId": "listModels", "security": [{"bearer": []}, {}],
      "responses": {"200": {"description": "the served model", "content": {"application/json": {"schema":
        {"type": "object", "required": ["object", "data"], "properties": {"object": {"type": "string"},
         "data": {"type": "array", "items": {"type": "object", "required": ["id", "object"],
         "properties": {"id": {"type": "string"}, "object": {"type": "string"},
                        "max_model_len": {"type": "integer"}}}}}}}}},
        "401": {"$ref": "#/components/responses/Error"}, "503": {"$ref": "#/components/responses/Error"}}}},
    "/tokenize": {"post": {"operationId": "tokenize", "security": [{"bearer": []}, {}],
      "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object",
        "properties": {"prompt": {"type": "string"}, "add_special_tokens": {"type": "boolean"},
                       "messages": {"type": "array", "minItems": 1,
                                    "items": {"$ref": "#/components/schemas/ChatMessage"}}}}}}},
      "responses": {"200": {"description": "token ids", "content": {"application/json": {"schema":
        {"type": "object", "required": ["tokens", "count"], "properties": {
         "tokens": {"type": "array", "items": {"type": "integer"}}, "count": {"type": "integer"},
         "max_model_len": {"type": "integer"}}}}}},
        "400": {"$ref": "#/components/responses/Error"}, "401": {"$ref": "#/components/responses/Error"},
        "503": {"$ref": "#/components/responses/Error"}}}},
    "/detokenize": {"post": {"operationId": "detokenize", "security": [{"bearer": []}, {}],
      "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object",
        "required": ["tokens"], "properties": {"tokens": {"type": "array",
          "items": {"type": "integer", "minimum": 0, "maximum": @VOCAB_MAX@}}}}}}},
      "responses": {"200": {"description": "text", "content": {"application/json": {"schema":
        {"type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}}}}},
        "400": {"$ref": "#/components/responses/Error"}, "401": {"$ref": "#/components/responses/Error"},
        "503": {"$ref": "#/components/responses/Error"}}}},
    "/health": {"get": {"operationId": "health", "responses": {
      "200": {"description": "the model is loaded and the engine accepts requests"},
      "503": {"description": "loading, shutting down or failed"}}}},
    "/version": {"get": {"operationId": "version", "responses": {"200": {"description": "server version",
      "content": {"application/json": {"schema": {"type": "object", "required": ["version"],
        "properties": {"version": {"type": "string"}}}}}}}}},
    "/metrics": {"get": {"operationId": "metrics", "responses": {"200": {"description":
      "Prometheus text format 0.0.4", "content": {"text/plain": {"schema": {"type": "string"}}}}}}}
  }
})json";

}  // namespace

std::string OpenApiDocument(const std::string& version, int32_t vocab_size) {
  return absl::StrReplaceAll(
      kDocument, {{"@VERSION@", version}, {"@VOCAB_MAX@", std::to_string(vocab_size - 1)}});
}

}  // namespace pagedserve::openai
