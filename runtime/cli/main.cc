// pagedserve: one binary, several sub-commands.
//
//   pagedserve sim [flags]        KV memory simulator (naive vs paged allocation)
//   pagedserve generate [flags]   offline generation for one prompt
//   pagedserve serve [flags]      serve over ZeroMQ and HTTP (docs/serving.md)
//   pagedserve client [flags]     send a prompt / health / stats to a server
//   pagedserve keygen NAME        CurveZMQ key pair NAME.key / NAME.key_secret
//   pagedserve version            the version (also `pagedserve --version`)
//
// Flags may be spelled with dashes (--max-model-len) or underscores
// (--max_model_len): absl flags are named with underscores, so a dashed flag
// name that matches a defined flag is rewritten before parsing. Each flag
// applies to the sub-commands it was declared for (PAGEDSERVE_FLAG,
// common_flags.h); another sub-command's flag or an unknown flag is an error.
//
// `pagedserve --help` / `pagedserve help` list the commands,
// `pagedserve --version` (after any command, too) / `pagedserve version` print
// the version (the project's, CMakeLists.txt),
// `pagedserve COMMAND --help` / `pagedserve help COMMAND` a command's flags,
// `pagedserve --helpfull` every command's flags; all exit 0.
//
// Exit codes: 2 bad command line (unknown command or flag, a flag of another
// command, no command); 70 a flag declared without sub-commands (a bug);
// otherwise the command's own.
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/common_flags.h"
#include "runtime/cli/flag_registry.h"

namespace {

struct Command {
  std::function<int(const pagedserve::cli::Args&)> run;
  const char* summary;
};

// `pagedserve --version` / `pagedserve version`: the version alone on stdout
// (as `vllm --version`), exit 0.
int PrintVersion(const pagedserve::cli::Args& /*args*/) {
  std::fprintf(stdout, "%s\n", PAGEDSERVE_VERSION);
  return 0;
}

const std::map<std::string, Command>& Commands() {
  static const auto* commands = new std::map<std::string, Command>{
      {"sim", {pagedserve::cli::SimCommand, "KV memory simulator: naive vs paged allocation"}},
      {"generate",
       {pagedserve::cli::GenerateCommand, "offline generation for one prompt (no server)"}},
      {"serve",
       {pagedserve::cli::ServeCommand,
        "serve the model over ZeroMQ (docs/protocol.md) and HTTP (OpenAI API, docs/http.md)"}},
      {"client",
       {pagedserve::cli::ClientCommand, "send a prompt, --health or --stats to a server"}},
      {"keygen",
       {pagedserve::cli::KeygenCommand, "write a CurveZMQ key pair: NAME.key, NAME.key_secret"}},
      {"version", {PrintVersion, "print the version (as `pagedserve --version`)"}},
  };
  return *commands;
}

std::string Usage() {
  std::string u = "usage: pagedserve COMMAND [flags]\n\ncommands:\n";
  for (const auto& [name, c] : Commands())
    u += "  " + name + std::string(12 - name.size(), ' ') + c.summary + "\n";
  u += "\n`pagedserve COMMAND --help` lists a command's flags, `pagedserve --helpfull` all of "
       "them.";
  return u;
}

// Usage of `command` (known) or, when empty, of the binary.
std::string UsageOf(const std::string& command) {
  if (command.empty()) return Usage();
  return pagedserve::cli::SubcommandUsage(command, Commands().at(command).summary);
}

// --help / help [COMMAND] / --helpfull: the usage on stdout, exit 0; 2 for an
// unknown command.
int PrintHelp(const pagedserve::cli::ScannedCommandLine& line) {
  std::string command = line.subcommand == "help" && line.positional.size() > 1 ? line.positional[1]
                                                                                : line.subcommand;
  if (command == "help") command.clear();
  if (!command.empty() && Commands().count(command) == 0) {
    std::fprintf(stderr, "pagedserve: unknown command '%s'\n\n%s\n", command.c_str(),
                 Usage().c_str());
    return 2;
  }
  std::string text = UsageOf(command);
  if (line.helpfull && command.empty()) {
    for (const auto& [name, c] : Commands()) text += "\n\n" + UsageOf(name);
  }
  std::fprintf(stdout, "%s\n", text.c_str());
  return 0;
}

// "--max-model-len=8" -> "--max_model_len=8" when max_model_len is a flag,
// "--no-enable-prefix-caching" -> "--noenable_prefix_caching" (absl's negation)
// for a boolean. Values are never touched: only an argument starting with "--"
// whose name part names a flag, and nothing after a bare "--".
std::vector<std::string> NormalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> out;
  bool after_dashdash = false;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (!after_dashdash && a == "--") after_dashdash = true;
    if (!after_dashdash && i > 0 && a.size() > 2 && a.compare(0, 2, "--") == 0) {
      const size_t eq = a.find('=');
      std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      std::string underscored = name;
      for (char& c : underscored) c = c == '-' ? '_' : c;
      const std::string base =
          underscored.compare(0, 3, "no_") == 0 ? underscored.substr(3) : underscored;
      if (underscored != name && absl::FindCommandLineFlag(underscored) != nullptr) {
        a = absl::StrCat("--", underscored, eq == std::string::npos ? "" : a.substr(eq));
      } else if (base != underscored && absl::FindCommandLineFlag(base) != nullptr) {
        a = absl::StrCat("--no", base,
                         eq == std::string::npos ? "" : a.substr(eq));  // absl's --noflag
      }
    }
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (absl::Status s = pagedserve::cli::CheckRegistry(); !s.ok()) {
    std::fprintf(stderr, "pagedserve: internal error: %s\n", std::string(s.message()).c_str());
    return 70;
  }
  absl::SetProgramUsageMessage(Usage());
  std::vector<std::string> normalized = NormalizeFlagNames(argc, argv);
  absl::StatusOr<pagedserve::cli::ScannedCommandLine> line =
      pagedserve::cli::ScanCommandLine(normalized);
  if (line.ok() && (line->help || line->helpfull || line->subcommand == "help")) {
    return PrintHelp(*line);
  }
  if (line.ok() && line->version) return PrintVersion({});
  if (line.ok() && line->subcommand.empty()) {
    std::fprintf(stderr, "%s\n", Usage().c_str());
    return 2;
  }
  if (line.ok() && Commands().count(line->subcommand) == 0) {
    std::fprintf(stderr, "pagedserve: unknown command '%s'\n\n%s\n", line->subcommand.c_str(),
                 Usage().c_str());
    return 2;
  }
  absl::Status status = line.ok() ? pagedserve::cli::CheckFlagsApply(*line) : line.status();
  if (!status.ok()) {
    const std::string command = line.ok() ? " " + line->subcommand : "";
    std::fprintf(stderr, "pagedserve%s: %s\n(`pagedserve%s --help` lists the flags)\n",
                 command.c_str(), std::string(status.message()).c_str(), command.c_str());
    return 2;
  }
  std::vector<char*> normalized_argv;
  normalized_argv.reserve(normalized.size() + 1);
  for (std::string& a : normalized) normalized_argv.push_back(a.data());
  normalized_argv.push_back(nullptr);
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(normalized.size()), normalized_argv.data());
  pagedserve::cli::Args args(positional.begin() + 1, positional.end());
  if (absl::Status s = pagedserve::cli::ConfigureLogging(); !s.ok()) {
    std::fprintf(stderr, "pagedserve %s: %s\n", line->subcommand.c_str(),
                 std::string(s.message()).c_str());
    return 2;
  }
  return Commands().at(line->subcommand).run(args);
}
