#!/usr/bin/env bash
# Fetches the chat-template corpus, the real templates in llama.cpp's tree
# (vendor/llama.cpp/models/templates/*.jinja of the llama-cpp-python source
# package on PyPI), into a cache directory outside git, checks the package's
# sha256 and prints the directory. Does nothing (but print it) when the
# templates are already there. tests/chat/make_fixtures.py renders them with
# Python jinja2; chat_conformance_test renders them with runtime/chat and checks
# each file's sha256 against tests/fixtures/chat_templates.json. The same
# package's tokenizer corpus (vendor/llama.cpp/models/ggml-vocab-*.gguf with the
# .inp/.out test files) goes to the vocab/ subfolder, for
# tests/tokenizer/llamacpp_vocab_test.cc, and its GBNF grammars
# (vendor/llama.cpp/grammars/*.gbnf) to the grammars/ subfolder, for
# tests/grammar/gbnf_test.cc.
#
#   tests/chat/fetch_templates.sh    prints e.g. ~/.cache/pagedserve/templates/llama-cpp-python-0.3.36
#   PAGEDSERVE_TEMPLATES_DIR=DIR tests/chat/fetch_templates.sh   use DIR instead of the cache
set -euo pipefail

package=llama-cpp-python
version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
dir=${PAGEDSERVE_TEMPLATES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pagedserve/templates/$package-$version}
stamp="$dir/.complete"
vocab_stamp="$dir/vocab/.complete"
grammar_stamp="$dir/grammars/.complete"

if [ -f "$stamp" ] && [ -f "$vocab_stamp" ] && [ -f "$grammar_stamp" ]; then echo "$dir"; exit 0; fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch_templates: downloading the $package==$version source package from PyPI (~75 MB)" >&2
python3 -m pip download -q --no-deps --no-binary :all: --dest "$tmp" "$package==$version" >&2
tarball="$tmp/llama_cpp_python-$version.tar.gz"
if ! echo "$sha256  $tarball" | sha256sum --check --status; then
  echo "fetch_templates: sha256 mismatch for $tarball (expected $sha256)" >&2
  exit 1
fi
mkdir -p "$tmp/x" "$dir/vocab" "$dir/grammars"
tar -xzf "$tarball" -C "$tmp/x" --wildcards "*/vendor/llama.cpp/models/templates/*.jinja" \
  "*/vendor/llama.cpp/models/ggml-vocab-*" "*/vendor/llama.cpp/grammars/*.gbnf"
cp "$tmp"/x/*/vendor/llama.cpp/models/templates/*.jinja "$dir/"
cp "$tmp"/x/*/vendor/llama.cpp/models/ggml-vocab-* "$dir/vocab/"
cp "$tmp"/x/*/vendor/llama.cpp/grammars/*.gbnf "$dir/grammars/"
count=$(ls "$dir"/*.jinja | wc -l)
vocabs=$(ls "$dir"/vocab/*.gguf | wc -l)
grammars=$(ls "$dir"/grammars/*.gbnf | wc -l)
echo "fetch_templates: $count templates in $dir, $vocabs tokenizer vocabularies in $dir/vocab," \
  "$grammars grammars in $dir/grammars" >&2
touch "$stamp" "$vocab_stamp" "$grammar_stamp"
echo "$dir"
