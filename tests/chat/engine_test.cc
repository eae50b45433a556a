// Unit tests of runtime/chat: each construct on small templates, errors with
// their messages, and the sandbox's limits.
//
// The expected outputs of the tables are Python jinja2 3.1.6's, rendered in
// Hugging Face's environment (tests/chat/make_fixtures.py make_environment)
// with the variables of Variables() below and the fixed clock of FixedClock().
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/chat/template.h"

namespace pagedserve::chat {
namespace {

struct RenderCase {
  const char* source;
  const char* expected;
};

Value Message(const char* role, const char* content) {
  Dict m;
  m.Set("role", Value(role));
  m.Set("content", Value(content));
  return Value::FromDict(std::move(m));
}

Dict Variables() {
  Dict vars;
  vars.Set("messages", Value::List({Message("system", "Be brief."), Message("user", "Hi"),
                                    Message("assistant", "Hello")}));
  vars.Set("tools", Value(nullptr));
  vars.Set("add_generation_prompt", Value(true));
  vars.Set("bos_token", Value("<s>"));
  vars.Set("eos_token", Value("</s>"));
  return vars;
}

// 2025-03-07 14:05:09, a Friday (make_fixtures.py FIXED_NOW).
std::tm FixedClock() {
  std::tm tm{};
  tm.tm_year = 125;
  tm.tm_mon = 2;
  tm.tm_mday = 7;
  tm.tm_hour = 14;
  tm.tm_min = 5;
  tm.tm_sec = 9;
  tm.tm_wday = 5;
  tm.tm_yday = 65;
  return tm;
}

absl::StatusOr<std::string> Render(const std::string& source, const RenderLimits& limits = {},
                                   const Dict& vars = Variables()) {
  absl::StatusOr<Template> t = Template::Parse(source);
  if (!t.ok()) return t.status();
  return t->Render(vars, limits, FixedClock);
}

template <size_t N>
void ExpectRenders(const RenderCase (&cases)[N]) {
  for (const RenderCase& c : cases) {
    SCOPED_TRACE(c.source);
    absl::StatusOr<std::string> out = Render(c.source);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(*out, c.expected);
  }
}

// The error of rendering `source`: its code and a part of its message.
void ExpectError(const std::string& source, absl::StatusCode code, const std::string& message,
                 const RenderLimits& limits = {}) {
  SCOPED_TRACE(source);
  absl::StatusOr<std::string> out = Render(source, limits);
  ASSERT_FALSE(out.ok()) << "rendered: " << *out;
  EXPECT_EQ(out.status().code(), code) << out.status();
  EXPECT_NE(out.status().message().find(message), std::string::npos) << out.status();
}

// ---- Whitespace
const RenderCase kWhitespace[] = {
    {"a\n  {% if true %}\n  b\n  {% endif %}\nc\n", "a\n  b\nc"},
    {"a\n  {%+ if true %}\n  b\n  {%+ endif %}\nc", "a\n    b\n  c"},
    {"a  {{- 'x' -}}  b {# comment #}\n c {#- c -#}  d", "axb  cd"},
    {"{% if true %}x{% endif %}  \n{% if true %}y{% endif %}", "x  \ny"},
    {"  {# comment #}\nnext", "next"},
    {"{{ 'a' }}\n{{ 'b' }}\n", "a\nb"},
    {"line1\r\nline2\rline3\n\n", "line1\nline2\nline3\n"},
    {"x\n\t {% if true %}\t\n y\n {%- endif %}  \n z", "x\n\t\n y  \n z"},
    {"{% if true -%}\n\n   a\n{%- endif %}", "a"},
    {"a {#- c #} b {# c -#} c {#+ c #} d", "a b c  d"},
    {"{%- if 1 %}\n  x\n{% endif -%}\n\ny", "  x\ny"},
    {"a\n{% raw %}\n  {{ x }}\n{% endraw %}\nb", "a\n\n  {{ x }}\nb"},
    {"  {%- raw -%}  x  {%- endraw -%}  y", "xy"},
    {"{% for i in range(3) -%}\n  {{ i }}\n{%- endfor %}", "012"},
    {"<{%- for i in [1, 2] %}\n  {{ i }}\n{%- endfor %}>", "<  1  2>"},
    {"  {% set x = 1 %}  {{ x }}\n  {% set y = 2 %}\n{{ y }}", "  1\n2"},
    {"{% macro m() -%}\n  body\n{%- endmacro %}[{{ m() }}]", "[body]"},
    {"{#\nmultiline\ncomment\n#}\nafter", "after"},
    {"text with } and %} and #} and }} outside", "text with } and %} and #} and }} outside"},
};
// ---- Statements
const RenderCase kStatements[] = {
    {"{% if false %}a{% elif 0 %}b{% elif none %}c{% elif '' %}d{% elif [] %}e{% else %}f{% endif %}",
     "f"},
    {"{% if true %}{% if false %}a{% else %}b{% endif %}{% endif %}", "b"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = (3, 4) %}{{ c }}", "12(3, 4)"},
    {"{% set t %}  block {{ 1 + 1 }} {% endset %}[{{ t }}]", "[  block 2 ]"},
    {"{% set t | upper | trim %} block {% endset %}[{{ t }}]", "[BLOCK]"},
    {"{% filter upper %}hello {{ 'x' }}{% endfilter %}", "HELLO X"},
    {"{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", "3[]"},
    {"{% raw %}{{ not rendered }}{% endraw %}", "{{ not rendered }}"},
    {"{% generation %}gen {{ 1 }}{% endgeneration %}", "gen 1"},
    {"{% print 1 + 1 %}", "2"},
    {"{{ 1, 'a' }}", "(1, 'a')"},
};
// ---- Loops
const RenderCase kLoops[] = {
    {"{% for x in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
     "1032TrueFalse3|2121FalseFalse3|3210FalseTrue3|"},
    {"{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.cycle('a','b') }};{% endfor %}",
     "-2-a;1-3-b;2--a;"},
    {"{% for x in [1,2,3,4,5] if x is odd %}{{ x }}{{ loop.length }}{% else %}E{% endfor %}",
     "133353"},
    {"{% for x in [] %}{{ x }}{% else %}empty{% endfor %}", "empty"},
    {"{% for x in range(10) %}{% if x == 5 %}{% break %}{% endif %}{% if x is even %}{% continue %}{% endif %}{{ x }}{% endfor %}",
     "13"},
    {"{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }},{% endfor %}", "b=1,a=2,"},
    {"{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}", "37"},
    {"{% for c in 'héllo' %}[{{ c }}]{% endfor %}", "[h][é][l][l][o]"},
    {"{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}", "xy"},
    {"{% for i in undefined_var %}no{% else %}empty{% endfor %}", "empty"},
    {"{% for m in messages %}{{ m.role }}:{{ m.content }}{% if not loop.last %}, {% endif %}{% endfor %}",
     "system:Be brief., user:Hi, assistant:Hello"},
    {"{% for i in [1, 2] %}{% set outer = loop %}{% for j in [3] %}{{ outer.index }}{{ loop.index }}{% endfor %}{% endfor %}",
     "1121"},
};
// ---- Scoping
const RenderCase kScoping[] = {
    {"{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = x + 10 %}{{ x }},{% endfor %}{{ x }}",
     "111,111,1"},
    {"{% if true %}{% set z = 5 %}{% endif %}{{ z }}", "5"},
    {"{% for i in [1] %}{% set z = 5 %}{% endfor %}[{{ z }}]", "[]"},
    {"{% set ns = namespace(a=1, b=[]) %}{% for i in [1, 2] %}{% set ns.a = ns.a + i %}{% set ns.b = ns.b + [i] %}{% endfor %}{{ ns.a }} {{ ns.b }}",
     "4 [1, 2]"},
    {"{% set ns = namespace(found=false) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}",
     "True"},
    {"{{ namespace(a=1).a }} {{ namespace({'b': 2}).b }}", "1 2"},
    {"{% set a = 1 %}{% macro m() %}{{ a }}{% endmacro %}{% set a = 2 %}{{ m() }}", "2"},
    {"{% macro m(x) %}{% set y = x * 2 %}{{ y }}{% endmacro %}{% set y = 1 %}{{ m(3) }}{{ y }}",
     "61"},
    {"{% for i in [1, 2] %}{% macro m() %}{{ i }}{% endmacro %}{{ m() }}{% endfor %}", "12"},
};
// ---- Macros
const RenderCase kMacros[] = {
    {"{% macro m(a, b=2, c='x') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|{{ m(1, c='y') }}|{{ m() }}",
     "12x|13x|12y|2x"},
    {"{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}", "(1, 2){'k': 3}"},
    {"{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}",
     "54321"},
    {"{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}inner{% endcall %}", "<inner>"},
    {"{% macro w() %}<{{ caller(1, 2) }}>{% endmacro %}{% call(a, b) w() %}{{ a + b }}{% endcall %}",
     "<3>"},
    {"{% macro m(a, b=a) %}{{ b }}{% endmacro %}{{ m(7) }}", "7"},
};
// ---- Expressions
const RenderCase kExpressions[] = {
    {"{{ 1 + 2 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
     "3 3.5 3 -4 1 2 1024 0.5 3.0 0.5"},
    {"{{ 'a' ~ 1 ~ none ~ true ~ [1, 'b'] ~ {'k': 'v'} ~ (1,) ~ 1.0 }}",
     "a1NoneTrue[1, 'b']{'k': 'v'}(1,)1.0"},
    {"{{ not 1 }} {{ not not 1 }} {{ 1 and 2 }} {{ 0 and 2 }} {{ 0 or 3 }} {{ none or '' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 4 }}",
     "False True 2 0 3  True False"},
    {"{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }} {{ [1] == [1] }} {{ (1,) == [1] }} {{ {'a': 1} == {'a': 1} }} {{ none == none }}",
     "True True True True False True True"},
    {"{{ 'b' > 'a' }} {{ [1, 2] < [1, 3] }}", "True True"},
    {"{{ 'ab' in 'xaby' }} {{ 1 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ 'z' in undefined_var }}",
     "True True True True False"},
    {"{{ 'abcdef'[1:3] }} {{ 'abcdef'[::-1] }} {{ 'abcdef'[-2:] }} {{ [1,2,3,4][::2] }} {{ [1,2,3][5:] }} {{ 'héllo'[1] }} {{ [1,2,3][-1] }} {{ 'abc'[10] }}|",
     "bc fedcba ef [1, 3] [] é 3 |"},
    {"{{ [1, 2, 3][1::-1] }} {{ 'abcdef'[-3:-1] }} {{ 'abcdef'[4:1:-1] }} {{ [1,2,3][none:2] }}",
     "[2, 1] de edc [1, 2]"},
    {"{{ 'yes' if 1 else 'no' }} {{ 'yes' if 0 }}|{{ (1 if 0) is defined }}", "yes |False"},
    {"{{ 'a' if true else 'b' if false else 'c' }} {{ 1 if 0 else 2 if 0 else 3 }}", "a 3"},
    {"{{ -2 ** 2 }} {{ (-2) ** 2 }} {{ 2 ** 3 ** 2 }} {{ 10 - 2 - 3 }} {{ 2 * 3 + 4 }} {{ (1 + 2) ~ 3 }} {{ 'a' ~ (1 + 2) }}",
     "4 4 64 5 10 33 a3"},
    {"{{ not 1 == 2 }} {{ not 1 in [1] }}", "True False"},
    {"{{ 'a' * 3 }} {{ 3 * 'ab' }} {{ [1] * 3 }} {{ 'a' * -1 }}| {{ [1, 2] + [3] }} {{ (1, 2) + (3,) }}",
     "aaa ababab [1, 1, 1] | [1, 2, 3] (1, 2, 3)"},
    {"{{ undefined_var }}|{{ undefined_var is defined }}|{{ none.x }}|{{ 'x'.foo }}", "|False||"},
    {"{{ {'a': 1}.a }} {{ {'items': 5}['items'] }} {{ {'a': {'b': [10, 20]}}.a.b.1 }} {{ {'get': 1}.get('get') }}",
     "1 5 20 1"},
    {"{{ messages[0]['content'] }} {{ messages|length }} {{ messages[-1].role }} {{ messages[1:]|length }}",
     "Be brief. 3 assistant 2"},
    {"{{ [1,2,3][true] }} {{ {true: 'y'}[1] }} {{ {1: 'x'}[1.0] }} {{ (0.5).real }}", "2 y x 0.5"},
    {"{{ x|default('d') }} {{ x ~ 'a' }} {{ (x or 'd') }} {{ x and 'no' }}|{{ not x }} {{ x == none }} {{ x == x }}",
     "d a d |True False True"},
};
// ---- Literals
const RenderCase kLiterals[] = {
    {"{{ 1e20 }} {{ 1.5e16 }} {{ 1e16 }} {{ 0.1 + 0.2 }} {{ 1/3 }} {{ 0.0001 }} {{ 0.00001 }} {{ -0.0 }} {{ 1e-7 }} {{ 3.0 }} {{ 2.5e-5 }} {{ 5e-324 }} {{ 1e22 }}",
     "1e+20 1.5e+16 1e+16 0.30000000000000004 0.3333333333333333 0.0001 1e-05 -0.0 1e-07 3.0 2.5e-05 5e-324 1e+22"},
    {"{{ [1, 'a', none, true, 1.5, [2], {'x': (1, 2)}] }} {{ () }} {{ [] }} {{ {} }}",
     "[1, 'a', None, True, 1.5, [2], {'x': (1, 2)}] () [] {}"},
    {"{{ \"it's\" }} {{ ['it\\'s', 'say \"hi\"', 'both \\' \"', 'tab\\t', 'nl\\n', 'uni é 🦙', '\\x00\\x7f\\x85\\xa0\\u200b'] }}",
     "it's [\"it's\", 'say \"hi\"', 'both \\' \"', 'tab\\t', 'nl\\n', 'uni é 🦙', '\\x00\\x7f\\x85\\xa0\\u200b']"},
    {"{{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1_000 }} {{ 1.5e3 }} {{ 1E2 }}",
     "31 15 5 1000 1500.0 100.0"},
    {"{{ 'a' 'b' }} {{ \"c\" 'd' }} {{ '\\u00e9\\x41\\101' }} {{ 'tab\\there' }} {{ 'unknown\\d' }}",
     "ab cd éAA tab\there unknown\\d"},
    {"{{ {'a': 1}}}", "{'a': 1}"},
    {"{{ [1, 2,] }} {{ {'a': 1,} }} {{ range(2,)|list }}", "[1, 2] {'a': 1} [0, 1]"},
};
// ---- Filters
const RenderCase kFilters[] = {
    {"{{ '  x  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'abc'|upper }}|{{ 'ABC'|lower }}|{{ 'hello-world foo(bar)'|title }}|{{ 'hELLO wORLD'|capitalize }}|{{ none|string }}|{{ 5|string }}|{{ [1]|string }}",
     "x|a|ABC|abc|Hello-World Foo(Bar)|Hello world|None|5|[1]"},
    {"{{ [1,2,3]|length }} {{ 'héllo'|length }} {{ {'a':1}|count }} {{ undefined_var|length }} {{ [3,1,2]|first }} {{ [3,1,2]|last }} {{ []|first }}| {{ 'abc'|first }} {{ {'a': 1, 'b': 2}|last }}",
     "3 5 1 0 3 2 | a b"},
    {"{{ [1, 'a', none]|join(',') }} {{ [1, 2]|join }} {{ [{'n': 'x'}, {'n': 'y'}]|join('-', attribute='n') }} {{ undefined_var|join(',') }}|",
     "1,a,None 12 x-y |"},
    {"{{ {'b': 2, 'a': 1, 'C': 3}|dictsort }} {{ {'b': 2, 'a': 1}|dictsort(by='value', reverse=true) }} {{ {'b': 1, 'B': 2, 'a': 0}|dictsort(true) }}",
     "[('a', 1), ('b', 2), ('C', 3)] [('b', 2), ('a', 1)] [('B', 2), ('a', 0), ('b', 1)]"},
    {"{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ [3, 1, 2]|sort(reverse=true) }} {{ [{'a': 2}, {'a': 1}]|sort(attribute='a') }}",
     "[1, 2, 3] ['A', 'b', 'c'] ['A', 'b', 'c'] [3, 2, 1] [{'a': 1}, {'a': 2}]"},
    {"{{ [1, 2, 1, 'A', 'a']|unique|list }} {{ [1, 2]|reverse|list }} {{ 'abc'|reverse }}",
     "[1, 2, 'A'] [2, 1] cba"},
    {"{% if []|select %}truthy{% endif %} {{ [1, 0, 2]|select|list }} {{ [1, 0, 2]|reject|list }} {{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3]|select('gt', 1)|list }} {{ [1, 2, 3]|reject('equalto', 2)|list }}",
     "truthy [1, 2] [0] [1, 3] [2, 3] [1, 3]"},
    {"{% set ms = [{'r': 'a', 'x': 1}, {'r': 'b'}, {'r': 'a', 'x': 0}] %}{{ ms|selectattr('r', 'equalto', 'a')|list }} {{ ms|selectattr('x')|list }} {{ ms|rejectattr('x')|list }} {{ ms|map(attribute='r')|join }} {{ ms|map(attribute='x', default=9)|list }}",
     "[{'r': 'a', 'x': 1}, {'r': 'a', 'x': 0}] [{'r': 'a', 'x': 1}] [{'r': 'b'}, {'r': 'a', 'x': 0}] aba [1, 9, 0]"},
    {"{{ ['a', 'b']|map('upper')|list }} {{ [1.5, 2.5]|map('round')|list }} {{ ['1', '2']|map('int')|sum }}",
     "['A', 'B'] [2.0, 2.0] 3"},
    {"{{ [1, 2, 3]|sum }} {{ [{'v': 1}, {'v': 2}]|sum(attribute='v') }} {{ [1, 2]|sum(start=10) }} {{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ ['b', 'A']|min }}",
     "6 3 13 1 3 A"},
    {"{{ -5|abs }} {{ (-5)|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(method='ceil') }} {{ 2.9|round(method='floor') }} {{ 5|round }}",
     "5 5 2.0 4.0 2.67 3.0 2.0 5"},
    {"{{ '42'|int }} {{ '42.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ true|int }} {{ none|int }} {{ '0x1A'|int(base=16) }} {{ '1_000'|int }}",
     "42 42 0 7 3 1 0 26 1000"},
    {"{{ '3.5'|float }} {{ 'x'|float }} {{ 2|float }} {{ ' 1e3 '|float }} {{ 'inf'|float }}",
     "3.5 0.0 2.0 1000.0 inf"},
    {"{{ {'a': 1}|items|list }} {{ undefined_var|items|list }} {{ 'ab'|list }} {{ {'a': 1}|list }}",
     "[('a', 1)] [] ['a', 'b'] ['a']"},
    {"{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'x'|indent('> ', first=true) }}",
     "a\n    b\n\n    c|  a\n  b|a\n  \n  b|> x"},
    {"{{ 'one two  three'|wordcount }} {{ 'hello'|center(11) }}| {{ 'a long sentence here'|truncate(9) }} {{ 'a long sentence here'|truncate(9, true) }}",
     "3    hello   | a... a long..."},
    {"{{ undefined_var|default('d') }} {{ none|default('d') }} {{ none|default('d', true) }} {{ ''|d('e', true) }}",
     "d None d e"},
    {"{{ '%s-%s'|format(1, 2) }} {{ '%(x)s'|format(x=1) }} {{ [1, 2, 3]|batch(2)|list }} {{ [1, 2, 3]|slice(2)|list }}",
     "1-2 1 [[1, 2], [3]] [[1, 2], [3]]"},
    {"{{ {'a': 1}|attr('a') }}|{{ 1|attr('real') }}", "|1"},
};
// ---- Json
const RenderCase kJson[] = {
    {"{{ {'a': 1, 'b': [1, 2.5, none, true], 'c': 'é\"\\n\\u0001'}|tojson }}",
     "{\"a\": 1, \"b\": [1, 2.5, null, true], \"c\": \"é\\\"\\n\\u0001\"}"},
    {"{{ {'a': 1, 'b': [1, {'c': 2}], 'd': {}, 'e': []}|tojson(indent=2) }}",
     "{\n  \"a\": 1,\n  \"b\": [\n    1,\n    {\n      \"c\": 2\n    }\n  ],\n  \"d\": {},\n  \"e\": []\n}"},
    {"{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }} {{ 'é\\x7f'|tojson(ensure_ascii=true) }} {{ [1, 2]|tojson(separators=(',', ':')) }} {{ 1.0|tojson }} {{ 1e100|tojson }}",
     "{\"a\": 2, \"b\": 1} \"\\u00e9\\u007f\" [1,2] 1.0 1e+100"},
    {"{{ {1: 'a', 2.5: 'b', true: 'c', none: 'd'}|tojson }}",
     "{\"1\": \"c\", \"2.5\": \"b\", \"null\": \"d\"}"},
    {"{{ messages|tojson }}",
     "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello\"}]"},
};
// ---- Tests
const RenderCase kTests[] = {
    {"{{ 'a' is string }} {{ 1 is number }} {{ 1.5 is number }} {{ true is number }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ 1 is boolean }}",
     "True True True True True False True True False"},
    {"{{ {} is mapping }} {{ [] is mapping }} {{ [] is sequence }} {{ 'a' is sequence }} {{ {} is sequence }} {{ 1 is sequence }} {{ none is sequence }} {{ [] is iterable }} {{ 1 is iterable }} {{ x is iterable }}",
     "True False True True True False False True False True"},
    {"{{ none is none }} {{ 0 is none }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }}",
     "True False True False True False True True True False"},
    {"{{ 1 is eq 1 }} {{ 1 is ne 2 }} {{ 1 is lt 2 }} {{ 2 is gt 1 }} {{ 1 is le 1 }} {{ 1 is ge 2 }} {{ 1 is in [1] }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ 'upper' is filter }} {{ 'odd' is test }}",
     "True True True True True False True True True True True"},
    {"{{ range is callable }} {{ 'a' is callable }} {{ 'a'|safe is escaped }} {{ x is defined }} {{ x is undefined }} {{ 'a' is not string }}",
     "True False True False True False"},
    {"{{ ([1]|select) is iterable }} {{ ([1]|select) is sequence }} {{ {'a': 1}.items() is sequence }}",
     "True False False"},
};
// ---- Methods
const RenderCase kMethods[] = {
    {"{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  x '.lstrip() }}|{{ ' x  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}|{{ 'a\\nb\\r\\nc'.splitlines() }}",
     "x|a|x | x|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a b', 'c']|['a', 'b', 'c']"},
    {"{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} {{ 'hello world'.title() }} {{ \"they're bill's\".title() }} {{ 'hELLO'.capitalize() }} {{ 'ß'.upper() }} {{ 'ÉCOLE'.lower() }} {{ 'ΣΑΣ σας'.lower() }}",
     "True True Hello World They'Re Bill'S Hello SS école σας σας"},
    {"{{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '+', 1) }} {{ 'abc'.replace('', '.') }} {{ 'abcabc'.find('c') }} {{ 'abcabc'.rfind('c') }} {{ 'abc'.find('z') }} {{ 'aaa'.count('a') }}",
     "a+b+c a+b-c .a.b.c. 2 5 -1 3"},
    {"{{ '{} and {}'.format(1, 'x') }} {{ '{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='N') }} {{ '{:>5}|{:<4}|{:^7}|{:05d}|{:.2f}|{:,}'.format('ab', 'c', 'mid', 42, 3.14159, 1234567) }}",
     "1 and x ba N!    ab|c   |  mid  |00042|3.14|1,234,567"},
    {"{{ '%s is %d' % ('x', 5) }} {{ '%05.1f%%' % 3.14159 }} {{ '%(a)s' % {'a': 1} }} {{ '%r' % 'q' }}",
     "x is 5 003.1% 1 'q'"},
    {"{{ ', '.join(['a', 'b']) }} {{ 'abc'.isalpha() }} {{ '123'.isdigit() }} {{ ''.isdigit() }} {{ 'Ab'.isupper() }} {{ 'AB'.isupper() }}",
     "a, b True True False False True"},
    {"{{ 'x'.center(7, '*') }} {{ 'x'.ljust(3, '.') }} {{ 'x'.rjust(3) }} {{ '42'.zfill(5) }} {{ '-42'.zfill(5) }} {{ 'abc'.removeprefix('a') }} {{ 'a=b=c'.partition('=') }}",
     "***x*** x..   x 00042 -0042 bc ('a', '=', 'b=c')"},
    {"{{ {'a': 1}.get('a') }} {{ {'a': 1}.get('b') }} {{ {'a': 1}.get('b', 2) }} {{ {'a': 1}.keys()|list }} {{ {'a': 1}.values()|list }} {{ {'a': 1}.items()|list }} {{ {'a': 1}.items() }}",
     "1 None 2 ['a'] [1] [('a', 1)] dict_items([('a', 1)])"},
    {"{% set l = [1] %}{% if l.append is defined %}yes{% else %}no{% endif %} {{ (1, 2).index(2) }} {{ [1, 2, 2].count(2) }}",
     "no 1 2"},
};
// ---- Markup
const RenderCase kMarkup[] = {
    {"{{ '<a href=\"x\">&'|e }} {{ '<b>'|safe }} {{ ('<a>'|safe) + '<b>' }} {{ '<a>' + ('<b>'|safe) }} {{ ('<a>'|safe) ~ '<b>' }}",
     "&lt;a href=&#34;x&#34;&gt;&amp; <b> <a>&lt;b&gt; &lt;a&gt;<b> <a><b>"},
    {"{{ \"Use '\"|safe + 'f<x>' + \"'\"|safe }} {{ ('a'|safe).replace('a', '<') }} {{ ('%s'|safe)|format('<') }} {{ ('<'|safe|trim) + '>' }}",
     "Use 'f&lt;x&gt;' &lt; &lt; <&gt;"},
};
// ---- Globals
const RenderCase kGlobals[] = {
    {"{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ range(0)|list }}",
     "[0, 1, 2] [1, 4, 7] [5, 3, 1] []"},
    {"{{ dict(a=1, b='x') }} {{ dict([('a', 1)]) }} {{ dict({'a': 1}, b=2) }}",
     "{'a': 1, 'b': 'x'} {'a': 1} {'a': 1, 'b': 2}"},
    {"{{ strftime_now('%Y-%m-%d %H:%M:%S %A %B %d %b %j %p %I %y %a') }}",
     "2025-03-07 14:05:09 Friday March 07 Mar 066 PM 02 25 Fri"},
    {"{% set j = joiner('|') %}{% for i in [1,2,3] %}{{ j() }}{{ i }}{% endfor %}", "1|2|3"},
    {"{{ bos_token ~ messages[0].content ~ eos_token }} {{ tools is none }} {{ add_generation_prompt }}",
     "<s>Be brief.</s> True True"},
};

TEST(Engine, Whitespace) { ExpectRenders(kWhitespace); }
TEST(Engine, Statements) { ExpectRenders(kStatements); }
TEST(Engine, Loops) { ExpectRenders(kLoops); }
TEST(Engine, Scoping) { ExpectRenders(kScoping); }
TEST(Engine, Macros) { ExpectRenders(kMacros); }
TEST(Engine, Expressions) { ExpectRenders(kExpressions); }
TEST(Engine, Literals) { ExpectRenders(kLiterals); }
TEST(Engine, Filters) { ExpectRenders(kFilters); }
TEST(Engine, Json) { ExpectRenders(kJson); }
TEST(Engine, Tests) { ExpectRenders(kTests); }
TEST(Engine, Methods) { ExpectRenders(kMethods); }
TEST(Engine, Markup) { ExpectRenders(kMarkup); }
TEST(Engine, Globals) { ExpectRenders(kGlobals); }

// ---------------------------------------------------------------- errors

TEST(Errors, RaiseExceptionGivesTheTemplatesMessageAndLine) {
  ExpectError(
      "{% if messages[0].role == 'system' %}\n{{ raise_exception('System role not supported') }}{% endif %}",
      absl::StatusCode::kInvalidArgument, "line 2: System role not supported");
}

TEST(Errors, UndefinedValuesFailWhenUsedAsJinja2Does) {
  ExpectError("{{ x.y }}", absl::StatusCode::kInvalidArgument, "'x' is undefined");
  ExpectError("{{ messages[0].nothing.more }}", absl::StatusCode::kInvalidArgument,
              "'dict object' has no attribute 'nothing'");
  ExpectError("{{ x + 1 }}", absl::StatusCode::kInvalidArgument, "'x' is undefined");
  ExpectError("{{ x() }}", absl::StatusCode::kInvalidArgument, "'x' is undefined");
  ExpectError("{{ x < 1 }}", absl::StatusCode::kInvalidArgument, "'x' is undefined");
}

TEST(Errors, TypeErrorsAsPython) {
  ExpectError("{{ 1 + 'a' }}", absl::StatusCode::kInvalidArgument,
              "unsupported operand type(s) for +");
  ExpectError("{{ 'a' + 1 }}", absl::StatusCode::kInvalidArgument, "can only concatenate str");
  ExpectError("{{ 1 / 0 }}", absl::StatusCode::kInvalidArgument, "division by zero");
  ExpectError("{{ 1 in 'abc' }}", absl::StatusCode::kInvalidArgument,
              "requires string as left operand");
  ExpectError("{% for i in none %}{% endfor %}", absl::StatusCode::kInvalidArgument,
              "'NoneType' object is not iterable");
  ExpectError("{{ 5|length }}", absl::StatusCode::kInvalidArgument, "has no len()");
  ExpectError("{{ [1]|select|length }}", absl::StatusCode::kInvalidArgument,
              "'generator' has no len()");
  ExpectError("{% for a, b in [1] %}{% endfor %}", absl::StatusCode::kInvalidArgument,
              "not iterable");
  ExpectError("{% for a, b in [[1, 2, 3]] %}{% endfor %}", absl::StatusCode::kInvalidArgument,
              "too many values to unpack");
  ExpectError("{{ 9223372036854775807 + 1 }}", absl::StatusCode::kInvalidArgument,
              "integer overflow");
}

TEST(Errors, SyntaxErrorsNameTheProblemAndLine) {
  ExpectError("{% for %}", absl::StatusCode::kInvalidArgument, "line 1:");
  ExpectError("a\n{{ 1 + }}", absl::StatusCode::kInvalidArgument, "line 2: unexpected");
  ExpectError("{% if true %}unclosed", absl::StatusCode::kInvalidArgument,
              "expected 'elif' or 'else' or 'endif'");
  ExpectError("{{ 'unterminated }}", absl::StatusCode::kInvalidArgument, "unterminated string");
  ExpectError("{# no end", absl::StatusCode::kInvalidArgument, "Missing end of comment tag");
  ExpectError("{% raw %}no end", absl::StatusCode::kInvalidArgument,
              "Missing end of raw directive");
  ExpectError("{{ [1, 2 }}", absl::StatusCode::kInvalidArgument, "unexpected '}', expected ']'");
  ExpectError("{% do x %}", absl::StatusCode::kInvalidArgument, "Encountered unknown tag 'do'");
  ExpectError("{% endif %}", absl::StatusCode::kInvalidArgument, "Encountered unknown tag 'endif'");
  ExpectError("{% break %}", absl::StatusCode::kInvalidArgument, "'break' outside a for loop");
  ExpectError("{% for i in [1] %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}",
              absl::StatusCode::kInvalidArgument, "'continue' outside a for loop");
  ExpectError("{% macro m(a, a) %}{% endmacro %}", absl::StatusCode::kInvalidArgument,
              "duplicate argument 'a'");
  ExpectError("{% macro m(a=1, b) %}{% endmacro %}", absl::StatusCode::kInvalidArgument,
              "non-default argument follows default argument");
  ExpectError("{% set true = 1 %}", absl::StatusCode::kInvalidArgument, "can't assign to 'const'");
  ExpectError("{{ 1 is is none }}", absl::StatusCode::kInvalidArgument, "");
  ExpectError("\xff{{ 1 }}", absl::StatusCode::kInvalidArgument, "not valid UTF-8");
}

TEST(Errors, UnknownFiltersAndTestsFailAtParseUnlessInsideAnIf) {
  ExpectError("{{ x|from_json }}", absl::StatusCode::kInvalidArgument,
              "No filter named 'from_json'");
  ExpectError("{{ x is frobbed }}", absl::StatusCode::kInvalidArgument, "No test named 'frobbed'");
  ExpectError("{% if true %}{% for i in [1] %}{{ i|nope }}{% endfor %}{% endif %}",
              absl::StatusCode::kInvalidArgument, "No filter named 'nope'");
  // jinja2 compiles these and fails only if the filter is reached.
  EXPECT_EQ(*Render("{% if false %}{{ x|from_json }}{% endif %}ok"), "ok");
  EXPECT_EQ(*Render("{{ 'a' if true else x|from_json }}"), "a");
  ExpectError("{% if true %}{{ 1|from_json }}{% endif %}", absl::StatusCode::kInvalidArgument,
              "No filter named 'from_json'");
}

TEST(Errors, UnsupportedConstructsAreUnimplementedNamingThem) {
  ExpectError("{% include 'other.jinja' %}", absl::StatusCode::kUnimplemented,
              "'include' tag is not supported");
  ExpectError("{% extends 'base' %}", absl::StatusCode::kUnimplemented,
              "'extends' tag is not supported");
  ExpectError("{% import 'm' as m %}", absl::StatusCode::kUnimplemented,
              "'import' tag is not supported");
  ExpectError("{% for i in [1] recursive %}{% endfor %}", absl::StatusCode::kUnimplemented,
              "recursive for loops are not supported");
  ExpectError("{{ 'x'|urlize }}", absl::StatusCode::kUnimplemented, "the 'urlize' filter");
  ExpectError("{{ 'a\tb'.expandtabs() }}", absl::StatusCode::kUnimplemented,
              "str.expandtabs() is not supported");
  ExpectError("{{ lipsum() }}", absl::StatusCode::kUnimplemented, "lipsum");
  ExpectError("{{ '{:.2}'.format(1.5) }}", absl::StatusCode::kUnimplemented, "str.format");
}

TEST(Errors, NothingPrintsAMemoryAddress) {
  // jinja2 prints "<built-in method items of dict object at 0x...>" and
  // "<generator object ... at 0x...>": never identical, so refused.
  ExpectError("{{ messages[0].items }}", absl::StatusCode::kInvalidArgument, "cannot print");
  ExpectError("{{ [1, 2]|select }}", absl::StatusCode::kInvalidArgument,
              "cannot print a generator");
  ExpectError("{{ 'x' ~ range }}", absl::StatusCode::kInvalidArgument, "cannot concatenate");
  ExpectError("{{ [1]|select|tojson }}", absl::StatusCode::kInvalidArgument,
              "not JSON serializable");
}

// ---------------------------------------------------------------- sandbox

TEST(Sandbox, ListsAndDictsCannotBeChanged) {
  ExpectError("{% set l = [] %}{{ l.append(1) }}", absl::StatusCode::kInvalidArgument,
              "access to attribute 'append' of 'list' object is unsafe");
  ExpectError("{% set d = {} %}{{ d.update({'a': 1}) }}", absl::StatusCode::kInvalidArgument,
              "access to attribute 'update' of 'dict' object is unsafe");
  ExpectError("{{ messages.pop() }}", absl::StatusCode::kInvalidArgument, "unsafe");
}

TEST(Sandbox, NoPythonInternals) {
  EXPECT_EQ(*Render("{{ ''.__class__ }}|{{ messages.__class__ is defined }}"), "|False");
  ExpectError("{{ ''.__class__.__mro__ }}", absl::StatusCode::kInvalidArgument, "unsafe");
  ExpectError("{{ namespace(_private=1) }}", absl::StatusCode::kInvalidArgument,
              "underscore-prefixed");
  ExpectError("{% set ns = namespace() %}{% set ns._x = 1 %}", absl::StatusCode::kInvalidArgument,
              "underscore-prefixed");
}

TEST(Sandbox, RangeIsBoundedAsJinja2s) {
  ExpectError("{{ range(100001)|length }}", absl::StatusCode::kInvalidArgument,
              "MAX_RANGE (100000)");
}

TEST(Sandbox, LoopIterationsAreBounded) {
  RenderLimits limits;
  limits.max_loop_iterations = 1000;
  ExpectError("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}",
              absl::StatusCode::kResourceExhausted, "max_loop_iterations", limits);
  EXPECT_TRUE(
      Render("{% for i in range(10) %}{% for j in range(10) %}{% endfor %}{% endfor %}", limits)
          .ok());
}

TEST(Sandbox, MacroCallsCountAsIterations) {
  RenderLimits limits;
  limits.max_loop_iterations = 1000;
  ExpectError(
      "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(20) }}",
      absl::StatusCode::kResourceExhausted, "max_loop_iterations", limits);
}

TEST(Sandbox, MacroRecursionIsBounded) {
  ExpectError("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
              absl::StatusCode::kResourceExhausted, "max_call_depth");
  RenderLimits limits;
  limits.max_eval_depth = 100;
  ExpectError("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
              absl::StatusCode::kResourceExhausted, "max_eval_depth", limits);
}

TEST(Sandbox, OutputIsBounded) {
  RenderLimits limits;
  limits.max_output_bytes = 1000;
  ExpectError("{% for i in range(200) %}0123456789{% endfor %}",
              absl::StatusCode::kResourceExhausted, "max_output_bytes", limits);
  ExpectError("{{ 'a' * 1001 }}", absl::StatusCode::kResourceExhausted, "max_output_bytes", limits);
  ExpectError("{{ 'ab' * 1000000000000 }}", absl::StatusCode::kResourceExhausted,
              "max_output_bytes");
  ExpectError(
      "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
      absl::StatusCode::kResourceExhausted, "max_output_bytes");
}

TEST(Sandbox, TotalWorkIsBounded) {
  RenderLimits limits;
  limits.max_work_bytes = 100000;
  ExpectError("{% set s = 'x' * 1000 %}{% for i in range(1000) %}{% set t = s ~ s %}{% endfor %}",
              absl::StatusCode::kResourceExhausted, "max_work_bytes", limits);
}

TEST(Sandbox, NestingIsBounded) {
  ExpectError("{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}",
              absl::StatusCode::kResourceExhausted, "max_nesting");
  ExpectError("{{ " + std::string(1000, '[') + std::string(1000, ']') + " }}",
              absl::StatusCode::kResourceExhausted, "max_nesting");
  std::string deep;
  for (int i = 0; i < 200; ++i) deep += "{% if true %}";
  for (int i = 0; i < 200; ++i) deep += "{% endif %}";
  ExpectError(deep, absl::StatusCode::kResourceExhausted, "max_nesting");
  ExpectError("{{ " + std::string(1000, '-') + "1 }}", absl::StatusCode::kResourceExhausted,
              "max_nesting");
  ExpectError(
      "{{ " +
          [] {
            std::string s;
            for (int i = 0; i < 1000; ++i) s += "not ";
            return s;
          }() +
          "1 }}",
      absl::StatusCode::kResourceExhausted, "max_nesting");
}

TEST(Sandbox, ValuesCannotNestWithoutBound) {
  ExpectError(
      "{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}",
      absl::StatusCode::kResourceExhausted, "max_value_depth");
  // A namespace never holds another one, so namespaces cannot form a cycle.
  ExpectError("{% set a = namespace() %}{% set b = namespace() %}{% set a.b = [b] %}",
              absl::StatusCode::kUnimplemented, "namespace holding another namespace");
  ExpectError("{% set a = namespace() %}{% set a.self = a %}", absl::StatusCode::kUnimplemented,
              "namespace holding another namespace");
}

TEST(Sandbox, ATemplateRendersTheSameTwiceAndFromCopies) {
  absl::StatusOr<Template> t = Template::Parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}"
      "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(t.ok());
  const Template copy = *t;
  EXPECT_EQ(*t->Render(Variables()), "3");
  EXPECT_EQ(*copy.Render(Variables()), "3");
}

// The server renders one Template from many HTTP threads at once.
TEST(Sandbox, OneTemplateRendersOnManyThreadsAtOnce) {
  absl::StatusOr<Template> t = Template::Parse(
      "{% set ns = namespace(n=0) %}{% macro m(x) %}<{{ x|upper }}>{% endmacro %}"
      "{% for msg in messages %}{% set ns.n = ns.n + 1 %}{{ m(msg.content) }}{% endfor %}"
      "{{ ns.n }}{{ messages|map(attribute='role')|join(',') }}{{ 'x'|safe + '<' }}");
  ASSERT_TRUE(t.ok());
  const std::string expected = "<BE BRIEF.><HI><HELLO>3system,user,assistantx&lt;";
  std::vector<std::thread> threads;
  threads.reserve(4);
  std::atomic<int> wrong{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      const Dict vars = Variables();
      for (int k = 0; k < 200; ++k) {
        absl::StatusOr<std::string> out = t->Render(vars);
        if (!out.ok() || *out != expected) ++wrong;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(Clock, StrftimeNowReadsTheClock) {
  EXPECT_EQ(*Render("{{ strftime_now('%d %B %Y') }}"), "07 March 2025");
  absl::StatusOr<Template> t = Template::Parse("{{ strftime_now('%Y') }}");
  ASSERT_TRUE(t.ok());
  const absl::StatusOr<std::string> now = t->Render(Variables());  // the real clock
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->size(), 4u);
}

}  // namespace
}  // namespace pagedserve::chat
