// GBNF, llama.cpp's grammar format (llama.cpp grammars/README.md; the format
// vLLM's `guided_grammar` / `structured_outputs.grammar` accept as well),
// compiled into a Grammar (runtime/grammar/grammar.h) over the output's UTF-8
// bytes.
//
// Syntax, as llama.cpp's parser reads it (llama-grammar.cpp):
//   rule      name ::= alternatives      one rule per line; the start rule is `root`
//   name      [a-zA-Z0-9-]+              also a reference to a rule, defined anywhere
//   alternatives  sequence ( "|" sequence )*   (a newline may follow "|" and "::=")
//   sequence  term* where term is
//     "text"           a literal (UTF-8), escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH
//     [chars] [^chars] a character class: code points and ranges a-z, the same escapes
//     .                any character
//     ( alternatives ) a group; newlines are allowed inside
//   postfix   * + ? {m} {m,} {m,n} on a term
//   #         a comment to the end of the line
// A rule defined twice is an error (llama.cpp keeps the last definition
// silently). Errors: InvalidArgument naming the line and column and what is
// wrong (an undefined rule, no `root`, a syntax error, left recursion, the
// size bound).
//
// Thread safety: a pure function.
#ifndef PAGEDSERVE_RUNTIME_GRAMMAR_GBNF_H_
#define PAGEDSERVE_RUNTIME_GRAMMAR_GBNF_H_

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/grammar/grammar.h"

namespace pagedserve::grammar {

absl::StatusOr<std::shared_ptr<const Grammar>> CompileGbnf(std::string_view text);

}  // namespace pagedserve::grammar

#endif  // PAGEDSERVE_RUNTIME_GRAMMAR_GBNF_H_
