// Sub-commands of the `pagedserve` binary. Each takes the positional arguments
// left after flag parsing (argv[0] is the sub-command name) and returns the
// process exit code. Flags are absl flags defined beside each command.
#ifndef PAGEDSERVE_RUNTIME_CLI_COMMANDS_H_
#define PAGEDSERVE_RUNTIME_CLI_COMMANDS_H_

#include <string>
#include <vector>

namespace pagedserve::cli {

using Args = std::vector<std::string>;

int SimCommand(const Args& args);       // pagedserve sim: KV memory simulator
int GenerateCommand(const Args& args);  // pagedserve generate: offline generation, one prompt
int ServeCommand(const Args& args);  // pagedserve serve: the ZeroMQ server (rank 0) / worker ranks
int ClientCommand(
    const Args& args);  // pagedserve client: protocol v1 client (generate, health, stats)
int KeygenCommand(const Args& args);  // pagedserve keygen: a CurveZMQ key pair (certificate files)

}  // namespace pagedserve::cli

#endif  // PAGEDSERVE_RUNTIME_CLI_COMMANDS_H_
