// Which sub-commands each flag of the `pagedserve` binary applies to.
//
// Flags are absl flags (global to the process); this registry adds, per flag,
// the sub-commands that read it. A flag is declared with its sub-commands in one
// line (see common_flags.h):
//
//   PAGEDSERVE_FLAG("serve", int32_t, port, 8000, "serve: HTTP port");
//   PAGEDSERVE_FLAG("generate,serve", int32_t, block_size, 16, "tokens per KV block");
//
// main() scans the command line before absl parses it (ScanCommandLine): a flag
// of another sub-command or an unknown flag is an error (exit 2), and --help
// prints the usage of the sub-command it follows (SubcommandUsage). Flags absl
// itself defines (--flagfile, --fromenv, ...) are not registered and apply to
// every sub-command. Not thread-safe: registration runs during static
// initialisation, the queries in main() before any thread starts.
#ifndef PAGEDSERVE_RUNTIME_CLI_FLAG_REGISTRY_H_
#define PAGEDSERVE_RUNTIME_CLI_FLAG_REGISTRY_H_

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pagedserve::cli {

// Records that absl flag `flag_name` (underscored, as in ABSL_FLAG) applies to
// the sub-commands in `commands` (comma separated, e.g. "generate,serve").
// Returns true (a value for a static initialiser).
bool RegisterSubcommandFlag(absl::string_view commands, absl::string_view flag_name);

// Sorted names of the flags registered for `command` (underscored).
std::vector<std::string> FlagsOfSubcommand(absl::string_view command);

// Internal consistency, checked at startup: every registered name is a defined
// absl flag, and every absl flag defined in a file under runtime/cli/ is
// registered. FailedPrecondition naming the flag otherwise (a programming error).
absl::Status CheckRegistry();

// What a command line holds. Flag names are absl's (underscored); the
// sub-command is the first positional argument.
struct ScannedCommandLine {
  std::string subcommand;               // empty when there is none
  std::vector<std::string> positional;  // the sub-command and the arguments after it
  std::vector<std::string> flags;       // registered or absl flags given, in order
  bool help = false;                    // --help, -h, --helpshort
  bool helpfull = false;                // --helpfull
  bool version = false;                 // --version
};

// Scans argv (argv[0] is the program; flag names already underscored, see
// NormalizeFlagNames in main.cc) the way absl parses it: "-x" and "--x",
// "--x=v", "--x v" for non-boolean flags, "--nox" / "--no_x" for booleans,
// nothing after a bare "--" (all positional); --help / --helpfull / --version
// set their fields. InvalidArgument "unknown flag --x"
// for a flag absl does not define, and "invalid value 'v' for --x: ..." (or
// "missing value for --x") for a value absl's parser would refuse, unless
// help was asked for; absl's ParseCommandLine exits 1 on those, the binary
// wants 2. absl's directives (--flagfile, --fromenv, --tryfromenv,
// --undefok) are left to absl. Checking a value sets the flag to it
// (ParseFrom), as parsing the same argv afterwards does; not thread-safe
// (flags are global).
absl::StatusOr<ScannedCommandLine> ScanCommandLine(const std::vector<std::string>& argv);

// InvalidArgument when a registered flag in `line` does not apply to
// line.subcommand: "--block-size does not apply to `pagedserve sim` (it is a
// flag of generate, serve)". OK without a sub-command.
absl::Status CheckFlagsApply(const ScannedCommandLine& line);

// "usage: pagedserve COMMAND [flags]", `summary`, then each of the command's
// flags spelled with dashes, with its default and help text.
std::string SubcommandUsage(absl::string_view command, absl::string_view summary);

}  // namespace pagedserve::cli

// Defines absl flag FLAGS_<name> and registers it for `commands` (a string
// literal, comma separated). Use at namespace scope in runtime/cli/*.cc.
#define PAGEDSERVE_FLAG(commands, Type, name, default_value, help) \
  ABSL_FLAG(Type, name, default_value, help);                      \
  PAGEDSERVE_REGISTER_FLAG(commands, name)

// Registers a flag defined with ABSL_FLAG directly (e.g. one with .OnUpdate()).
#define PAGEDSERVE_REGISTER_FLAG(commands, name)                         \
  [[maybe_unused]] static const bool pagedserve_flag_registered_##name = \
      ::pagedserve::cli::RegisterSubcommandFlag(commands, #name)

#endif  // PAGEDSERVE_RUNTIME_CLI_FLAG_REGISTRY_H_
