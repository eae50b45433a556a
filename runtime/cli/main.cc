// pagedserve: one binary, several sub-commands.
//
//   pagedserve sim [flags]        KV memory simulator (naive vs paged allocation)
//
// `pagedserve help` or `pagedserve --help` lists them.
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
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
  };
  return *commands;
}

std::string Usage() {
  std::string u = "usage: pagedserve COMMAND [flags]\n\ncommands:\n";
  for (const auto& [name, c] : Commands()) u += "  " + name + std::string(12 - name.size(), ' ') + c.summary + "\n";
  u += "\n`pagedserve --helpfull` lists every flag.";
  return u;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(Usage());
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
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
