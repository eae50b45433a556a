// JSON Schema (draft 2020-12 subset: the keywords of OpenAI's strict mode and
// vLLM's structured outputs) compiled into a grammar over the bytes of the JSON
// text (runtime/grammar/grammar.h).
//
// Whitespace policy: COMPACT JSON. The grammar admits no whitespace between
// tokens (what json.dumps(separators=(",", ":")) writes); strings are UTF-8,
// with any JSON escape admitted in free strings and the canonical escapes
// (\" \\ \b \f \n \r \t \u00xx) inside `pattern` / `format` strings.
// Object members come in the order of `properties` (as XGrammar and OpenAI's
// strict mode emit them); properties not in `required` may be omitted.
//
// Keywords:
//   type (string or list), enum, const, anyOf, oneOf (the union of the
//   branches, exact because it compiles only when no instance can be valid under
//   two branches: proved, soundly and incompletely, by different types,
//   different const/enum values (numbers by value, members in any order), a
//   member one branch requires whose schemas are exclusive (a missing schema
//   taken from additionalProperties), an array element both require whose
//   schemas are exclusive, disjoint minItems..maxItems, or a union of exclusive
//   branches; otherwise InvalidArgument "unsupported 'oneOf': branches i and
//   j ..."), allOf with one element, $ref to "#" or a JSON pointer inside the document ($defs,
//   definitions, recursion allowed);
//   string: minLength, maxLength (code points), pattern (ECMA-262 search
//   semantics: unanchored unless ^/$; runtime/grammar/regex.h), format
//   date, time, date-time, uuid, email, ipv4;
//   integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum (numeric
//   bounds within +-1e18);
//   number: the same bounds, exact (decimal comparison, no rounding), within
//   +-1e18 and with at most 30 fraction digits; a bounded number is written
//   without an exponent (-?int(.frac)?: a subset of the valid instances). A
//   decimal bound is read as a double (as JSON parsers do) and taken as the
//   shortest decimal that reads back as it: the bound as written up to 15
//   significant digits;
//   object: properties, required, additionalProperties (false, true or a
//   schema). With `properties` given, only those properties are produced
//   (additional ones are not generated even when allowed: the language is a
//   subset of the valid instances); without `properties`, any member name with
//   values per additionalProperties;
//   array: items (schema or false), prefixItems, minItems, maxItems,
//   uniqueItems false.
// Annotations are ignored: $schema, $id, $comment, $defs, definitions, title,
// description, default, examples, deprecated, readOnly, writeOnly, and
// OpenAPI's discriminator (pydantic writes it beside oneOf).
// Anything else (not, if/then/else, patternProperties, uniqueItems true,
// multipleOf, minProperties, ...) is InvalidArgument whose
// message names the keyword and where it is ("unsupported JSON Schema keyword
// 'not' at #/properties/a"), never an unconstrained answer. So are schemas
// whose grammar exceeds Grammar::kMaxElements.
#ifndef PAGEDSERVE_RUNTIME_GRAMMAR_JSON_SCHEMA_H_
#define PAGEDSERVE_RUNTIME_GRAMMAR_JSON_SCHEMA_H_

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/grammar/grammar.h"

namespace pagedserve::grammar {

// `schema_json`: the schema as JSON text. Errors: InvalidArgument (not JSON,
// unsupported keyword, bad keyword value, too large).
absl::StatusOr<std::shared_ptr<const Grammar>> CompileJsonSchema(std::string_view schema_json);

// Adds the rules of the schema to `b` (so that several schemas share one
// grammar, as the tool-call grammar does) and returns the rule matching the
// schema's instances. Same errors as CompileJsonSchema; `b` may then hold
// unused rules (discard it).
absl::StatusOr<int32_t> AddJsonSchemaRules(GrammarBuilder& b, std::string_view schema_json);

// Any JSON object (OpenAI's response_format {"type": "json_object"}): compact.
absl::StatusOr<std::shared_ptr<const Grammar>> CompileJsonObject();

}  // namespace pagedserve::grammar

#endif  // PAGEDSERVE_RUNTIME_GRAMMAR_JSON_SCHEMA_H_
