// pagedserve: one binary, several sub-commands.
//
//   pagedserve sim [flags]        KV memory simulator (naive vs paged allocation)
//   pagedserve generate [flags]   offline generation for one prompt
//   pagedserve serve [flags]      serve over ZeroMQ (docs/serving.md)
//   pagedserve client [flags]     send a prompt / health / stats to a server
//   pagedserve keygen NAME        CurveZMQ key pair NAME.key / NAME.key_secret
//
// Flags may be spelled with dashes (--max-model-len) or underscores
// (--max_model_len): absl flags are named with underscores, so a dashed flag
// name that matches a defined flag is rewritten before parsing.
//
// `pagedserve help` or `pagedserve --help` lists them.
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "runtime/cli/commands.h"

namespace {

struct Command {
  std::function<int(const pagedserve::cli::Args&)> run;
  const char* summary;
};

const std::map<std::string, Command>& Commands() {
  static const auto* commands = new std::map<std::string, Command>{
      {"sim", {pagedserve::cli::SimCommand, "KV memory simulator: naive vs paged allocation"}},
      {"generate", {pagedserve::cli::GenerateCommand, "offline generation for one prompt (no server)"}},
      {"serve", {pagedserve::cli::ServeCommand, "serve the model over ZeroMQ (protocol v1, docs/protocol.md)"}},
      {"client", {pagedserve::cli::ClientCommand, "send a prompt, --health or --stats to a server"}},
      {"keygen", {pagedserve::cli::KeygenCommand, "write a CurveZMQ key pair: NAME.key, NAME.key_secret"}},
  };
  return *commands;
}

std::string Usage() {
  std::string u = "usage: pagedserve COMMAND [flags]\n\ncommands:\n";
  for (const auto& [name, c] : Commands()) u += "  " + name + std::string(12 - name.size(), ' ') + c.summary + "\n";
  u += "\n`pagedserve --helpfull` lists every flag.";
  return u;
}

// "--max-model-len=8" -> "--max_model_len=8" when max_model_len is a flag
// (or "--no-enable-prefix-caching" for a boolean). Values are never touched:
// only an argument starting with "--" whose name part names a flag, and
// nothing after a bare "--".
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
      const std::string base = underscored.compare(0, 3, "no_") == 0 ? underscored.substr(3) : underscored;
      if (underscored != name && (absl::FindCommandLineFlag(underscored) != nullptr ||
                                  absl::FindCommandLineFlag(base) != nullptr)) {
        a = "--" + underscored + (eq == std::string::npos ? "" : a.substr(eq));
      }
    }
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(Usage());
  std::vector<std::string> normalized = NormalizeFlagNames(argc, argv);
  std::vector<char*> normalized_argv;
  for (std::string& a : normalized) normalized_argv.push_back(a.data());
  normalized_argv.push_back(nullptr);
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(normalized.size()), normalized_argv.data());
  if (positional.size() < 2 || std::string(positional[1]) == "help") {
    std::fprintf(positional.size() < 2 ? stderr : stdout, "%s\n", Usage().c_str());
    return positional.size() < 2 ? 2 : 0;
  }
  auto it = Commands().find(positional[1]);
  if (it == Commands().end()) {
    std::fprintf(stderr, "pagedserve: unknown command '%s'\n\n%s\n", positional[1], Usage().c_str());
    return 2;
  }
  pagedserve::cli::Args args(positional.begin() + 1, positional.end());
  return it->second.run(args);
}
