#include "runtime/cli/flag_registry.h"

#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pagedserve::cli {
namespace {

using Registry = std::map<std::string, std::set<std::string>>;

Registry& GetRegistry() {
  static auto* registry = new Registry();
  return *registry;
}

std::string Dashed(absl::string_view flag_name) {
  std::string s(flag_name);
  for (char& c : s) c = c == '_' ? '-' : c;
  return "--" + s;
}

bool IsHelpFlag(absl::string_view name) {
  return name == "help" || name == "h" || name == "helpshort";
}

// The flag an argument names, following absl's "no" prefix for booleans
// (also "no_" as NormalizeFlagNames writes "--no-x"). Sets *negated.
absl::CommandLineFlag* FindFlag(absl::string_view name, bool* negated) {
  *negated = false;
  if (absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name)) return flag;
  absl::string_view base = name;
  if (!absl::ConsumePrefix(&base, "no")) return nullptr;
  absl::ConsumePrefix(&base, "_");
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(base);
  if (flag == nullptr || !flag->IsOfType<bool>()) return nullptr;
  *negated = true;
  return flag;
}

// Appends `text` to `out` in lines of at most `width` columns after `indent`.
void AppendWrapped(absl::string_view text, size_t indent, size_t width, std::string* out) {
  std::string line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && indent + line.size() + 1 + word.size() > width) {
      absl::StrAppend(out, std::string(indent, ' '), line, "\n");
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) absl::StrAppend(out, std::string(indent, ' '), line, "\n");
}

}  // namespace

bool RegisterSubcommandFlag(absl::string_view commands, absl::string_view flag_name) {
  std::set<std::string>& set = GetRegistry()[std::string(flag_name)];
  for (absl::string_view c : absl::StrSplit(commands, ',', absl::SkipWhitespace())) {
    set.insert(std::string(absl::StripAsciiWhitespace(c)));
  }
  return true;
}

std::vector<std::string> FlagsOfSubcommand(absl::string_view command) {
  std::vector<std::string> out;
  for (const auto& [name, commands] : GetRegistry()) {
    if (commands.count(std::string(command)) > 0) out.push_back(name);
  }
  return out;
}

absl::Status CheckRegistry() {
  for (const auto& [name, commands] : GetRegistry()) {
    if (absl::FindCommandLineFlag(name) == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("flag registry: '", name, "' is registered but not an absl flag"));
    }
  }
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->Filename().find("runtime/cli/") != std::string::npos &&
        GetRegistry().count(std::string(name)) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "flag registry: --", name, " (", flag->Filename(),
          ") applies to no sub-command; declare it with PAGEDSERVE_FLAG (common_flags.h)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ScannedCommandLine> ScanCommandLine(const std::vector<std::string>& argv) {
  ScannedCommandLine out;
  std::string unknown, bad_value;  // the first of each
  for (size_t i = 1; i < argv.size(); ++i) {
    absl::string_view a = argv[i];
    if (a == "--") {
      out.positional.insert(out.positional.end(), argv.begin() + i + 1, argv.end());
      break;
    }
    if (a.size() < 2 || a[0] != '-') {
      out.positional.emplace_back(a);
      continue;
    }
    absl::ConsumePrefix(&a, "-");
    absl::ConsumePrefix(&a, "-");
    const size_t eq = a.find('=');
    const absl::string_view name = a.substr(0, eq);
    if (IsHelpFlag(name) || name == "helpfull") {
      (name == "helpfull" ? out.helpfull : out.help) = true;
      continue;
    }
    if (name == "version") {
      out.version = true;
      continue;
    }
    bool negated = false;
    absl::CommandLineFlag* flag = FindFlag(name, &negated);
    if (flag == nullptr) {
      if (unknown.empty()) unknown = Dashed(name);
      continue;
    }
    // "--flag value": the value is the next argument (booleans take none).
    std::optional<std::string> value;
    if (eq != absl::string_view::npos) {
      value = std::string(a.substr(eq + 1));
    } else if (!negated && !flag->IsOfType<bool>()) {
      if (++i < argv.size()) value = argv[i];
      if (!value && bad_value.empty()) bad_value = absl::StrCat("missing value for ", Dashed(name));
    }
    // What absl's parser would refuse (and exit 1 for), refused here first;
    // not its own directives (--flagfile, --fromenv, ...), which it reads
    // itself (errors inside a flag file still exit 1, from absl).
    const bool directive =
        name == "flagfile" || name == "fromenv" || name == "tryfromenv" || name == "undefok";
    if (!directive && value && bad_value.empty()) {
      std::string error;
      if (negated) {
        bad_value = absl::StrCat("the negation of ", Dashed(flag->Name()), " takes no value");
      } else if (!flag->ParseFrom(*value, &error)) {
        bad_value =
            absl::StrCat("invalid value '", *value, "' for ", Dashed(flag->Name()), ": ", error);
      }
    }
    out.flags.emplace_back(flag->Name());
  }
  if (!out.positional.empty()) out.subcommand = out.positional.front();
  if (!out.help && !out.helpfull) {
    if (!unknown.empty()) return absl::InvalidArgumentError(absl::StrCat("unknown flag ", unknown));
    if (!bad_value.empty()) return absl::InvalidArgumentError(bad_value);
  }
  return out;
}

absl::Status CheckFlagsApply(const ScannedCommandLine& line) {
  if (line.subcommand.empty()) return absl::OkStatus();
  for (const std::string& name : line.flags) {
    auto it = GetRegistry().find(name);
    if (it == GetRegistry().end() || it->second.count(line.subcommand) > 0) continue;
    return absl::InvalidArgumentError(absl::StrCat(Dashed(name), " does not apply to `pagedserve ",
                                                   line.subcommand, "` (it is a flag of ",
                                                   absl::StrJoin(it->second, ", "), ")"));
  }
  return absl::OkStatus();
}

std::string SubcommandUsage(absl::string_view command, absl::string_view summary) {
  std::string u =
      absl::StrCat("usage: pagedserve ", command, " [flags]\n\n", summary, "\n\nflags:\n");
  for (const std::string& name : FlagsOfSubcommand(command)) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    std::string value = flag->DefaultValue();
    if (flag->IsOfType<std::string>()) value = absl::StrCat("\"", value, "\"");
    absl::StrAppend(&u, "  ", Dashed(name), " (default ", value, ")\n");
    AppendWrapped(flag->Help(), 6, 100, &u);
  }
  return u;
}

}  // namespace pagedserve::cli
