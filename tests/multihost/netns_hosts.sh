#!/usr/bin/env bash
# Several "hosts" on one machine for the multi-host tests: one network
# namespace per host, each with a veth `eth0` plugged into a bridge that lives
# in a namespace of its own (the switch). Addresses come from a private test
# range and exist only inside these namespaces: nothing is added to the
# machine's own network namespace, and no traffic leaves the switch.
#
#   netns_hosts.sh up PREFIX N       make hosts PREFIX-h0 .. PREFIX-h(N-1) and PREFIX-sw
#   netns_hosts.sh down PREFIX       delete them (killing what still runs inside)
#   netns_hosts.sh addr PREFIX I     print host I's address
#   netns_hosts.sh agent HOST CMD..  OpenMPI rsh agent: run CMD (a shell command line,
#                                    as ssh would) on HOST (an address of a host), in
#                                    its namespace under its own host name (UTS namespace)
#   netns_hosts.sh on PREFIX I CMD.. run CMD (argv) on host I, like `agent`
#   netns_hosts.sh impair PREFIX ARGS..  forward between the hosts through
#                                    impair_switch.py (ARGS: its --delay-ms, --jitter-ms,
#                                    --loss, --cut pI,..; port pI is host I's link)
#                                    instead of the bridge; prints the switch's stats
#                                    file. Replaces an impairment already in place.
#   netns_hosts.sh unimpair PREFIX   the bridge again (stops the switch)
#   netns_hosts.sh reap              delete the namespaces of runs whose owner pid is gone
#   netns_hosts.sh check             exit 0 when namespaces can be made here, else print why
#   netns_hosts.sh run N CMD..       the test harness: `check` (exit 77 with the reason when
#                                    it fails: CTest's skip code), `reap`, `up psmh$$ N`, run
#                                    CMD with PAGEDSERVE_NETNS_{SCRIPT,PREFIX,HOSTS} set, and
#                                    `down` on any exit (trap), passing on CMD's exit code
#
# Host I has address 10.213.<net>.(I+1)/24 on eth0 and host name PREFIX-hI.
# <net> is derived from PREFIX so that two prefixes never share a subnet.
# PREFIX must look like psmh<digits> (digits: the owner's pid, used by `reap`).
set -euo pipefail

die() { echo "netns_hosts: $*" >&2; exit 1; }

net_of() {  # third octet from the prefix's digits (1..250)
  local digits=${1#psmh}
  [[ "$digits" =~ ^[0-9]+$ ]] || die "prefix '$1' must be psmh<digits>"
  echo $(( (10#$digits % 250) + 1 ))
}
addr_of() { echo "10.213.$(net_of "$1").$(($2 + 1))"; }

ns_list() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-" || true; }

down() {
  local prefix=$1 ns pid
  for ns in $(ns_list "$prefix"); do
    # Processes this run started inside the namespace (ranks, orted, mpirun).
    for pid in $(ip netns pids "$ns" 2>/dev/null || true); do
      kill -9 "$pid" 2>/dev/null || true
    done
  done
  for ns in $(ns_list "$prefix"); do ip netns del "$ns" 2>/dev/null || true; done
}

up() {
  local prefix=$1 n=$2 net i ns
  net=$(net_of "$prefix")
  [[ "$n" =~ ^[0-9]+$ && "$n" -ge 1 && "$n" -le 8 ]] || die "N must be 1..8"
  down "$prefix"
  ip netns add "$prefix-sw"
  ip -n "$prefix-sw" link add br0 type bridge
  ip -n "$prefix-sw" link set br0 up
  for ((i = 0; i < n; i++)); do
    ns="$prefix-h$i"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # Created inside the host's namespace, the switch end moved to the switch.
    ip -n "$ns" link add eth0 type veth peer name "p$i" netns "$prefix-sw"
    ip -n "$prefix-sw" link set "p$i" master br0
    ip -n "$prefix-sw" link set "p$i" up
    ip -n "$ns" addr add "10.213.$net.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
  # The bridge runs no STP, so its ports forward at once: no wait needed.
}

# The user-space switch (impair_switch.py: netem's delay, jitter and loss, and
# partitions, for kernels without sch_netem) reads and writes whole frames, so
# both ends of every link get their offloads off (segmentation, receive
# coalescing and checksums done in software).
impair_stats() { echo "${TMPDIR:-/tmp}/$1-impair.json"; }

host_ports() {  # the switch-side port of every host of PREFIX: p0 p1 ...
  local ns
  for ns in $(ns_list "$1" | grep -E -- '-h[0-9]+$'); do echo "p${ns##*-h}"; done
}

stop_switch() {  # the impair switch is the only process in the switch namespace
  local prefix=$1 pids i
  pids=$(ip netns pids "$prefix-sw" 2>/dev/null || true)
  [[ -z "$pids" ]] && return 0
  # shellcheck disable=SC2086  # one pid per word
  kill $pids 2>/dev/null || true
  for ((i = 0; i < 30; i++)); do
    [[ -z "$(ip netns pids "$prefix-sw" 2>/dev/null)" ]] && return 0
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -9 $pids 2>/dev/null || true
}

unimpair() {
  local prefix=$1 p
  stop_switch "$prefix"
  for p in $(host_ports "$prefix"); do ip -n "$prefix-sw" link set "$p" master br0; done
}

impair() {
  local prefix=$1 ports="" ns i p stats pid
  shift
  command -v ethtool >/dev/null || die "impair needs ethtool (scripts/install-deps)"
  unimpair "$prefix"
  for ns in $(ns_list "$prefix" | grep -E -- '-h[0-9]+$'); do
    i=${ns##*-h}
    ip netns exec "$ns" ethtool -K eth0 tso off gso off gro off tx off rx off >/dev/null ||
      die "ethtool could not turn $ns eth0's offloads off"
    ip netns exec "$prefix-sw" ethtool -K "p$i" tso off gso off gro off tx off rx off >/dev/null ||
      die "ethtool could not turn p$i's offloads off"
    ports+="${ports:+,}p$i"
  done
  stats=$(impair_stats "$prefix")
  rm -f "$stats"
  # Started while the bridge still forwards (frames are duplicated for a
  # moment, which TCP ignores), so that the hosts are never cut off while it
  # starts; the ports leave the bridge once its sockets are bound.
  ip netns exec "$prefix-sw" python3 "$(dirname "$(readlink -f "$0")")/impair_switch.py" \
    --ports "$ports" --stats "$stats" "$@" </dev/null >/dev/null 2>"$stats.log" &
  pid=$!
  for ((i = 0; i < 100; i++)); do
    if [[ -s "$stats" ]]; then
      for p in ${ports//,/ }; do echo "link set $p nomaster"; done | ip -n "$prefix-sw" -batch - ||
        { unimpair "$prefix"; die "could not take the ports off the bridge"; }
      echo "$stats"
      return
    fi
    kill -0 "$pid" 2>/dev/null || die "impair_switch.py exited: $(cat "$stats.log")"
    sleep 0.1
  done
  stop_switch "$prefix"
  die "impair_switch.py did not start within 10 s"
}

host_ns() {  # namespace and index of an address (or host name) of a live run
  local host=$1 ns idx
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^psmh[0-9]+-h[0-9]+$'); do
    idx=${ns##*-h}
    if [[ "$host" == "$ns" || "$host" == "$(addr_of "${ns%-h*}" "$idx")" ]]; then
      echo "$ns"; return
    fi
  done
  die "no namespace for host '$host'"
}

case "${1:-}" in
  up) [[ $# -eq 3 ]] || die "usage: up PREFIX N"; up "$2" "$3" ;;
  down) [[ $# -eq 2 ]] || die "usage: down PREFIX"; down "$2"; rm -f "$(impair_stats "$2")"* ;;
  impair) [[ $# -ge 2 ]] || die "usage: impair PREFIX ARGS..."; impair "${@:2}" ;;
  unimpair) [[ $# -eq 2 ]] || die "usage: unimpair PREFIX"; unimpair "$2" ;;
  addr) [[ $# -eq 3 ]] || die "usage: addr PREFIX I"; addr_of "$2" "$3" ;;
  agent)
    # OpenMPI calls the agent as `agent [-x] HOST COMMAND...` (like ssh), with
    # COMMAND one shell command line split over the arguments.
    shift
    while [[ "${1:-}" == -* ]]; do shift; done
    [[ $# -ge 2 ]] || die "usage: agent HOST COMMAND..."
    ns=$(host_ns "$1"); shift
    # shellcheck disable=SC2016  # expanded by the inner shell
    exec ip netns exec "$ns" unshare --uts -- /bin/sh -c 'hostname "$0" && exec /bin/sh -c "$1"' \
      "$ns" "$*"
    ;;
  on)
    [[ $# -ge 4 ]] || die "usage: on PREFIX I CMD..."
    ns="$2-h$3"; shift 3
    # shellcheck disable=SC2016  # expanded by the inner shell
    exec ip netns exec "$ns" unshare --uts -- /bin/sh -c 'hostname "$0" && shift && exec "$@"' \
      "$ns" _ "$@"
    ;;
  reap)
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^psmh[0-9]+-' || true); do
      owner=${ns%%-*}; owner=${owner#psmh}
      kill -0 "$owner" 2>/dev/null || down "psmh$owner"
    done
    ;;
  check)
    [[ "$(id -u)" -eq 0 ]] || { echo "needs root (network namespaces)"; exit 1; }
    command -v ip >/dev/null || { echo "needs iproute2 (ip)"; exit 1; }
    command -v unshare >/dev/null || { echo "needs unshare (util-linux)"; exit 1; }
    command -v ethtool >/dev/null || { echo "needs ethtool (scripts/install-deps)"; exit 1; }
    probe="psmh$$-probe"
    if ! err=$(ip netns add "$probe" 2>&1); then echo "ip netns add fails: $err"; exit 1; fi
    ok=1
    err=$(ip -n "$probe" link add eth0 type veth peer name p0 2>&1) || ok=0
    ip netns del "$probe" 2>/dev/null || true
    [[ $ok -eq 1 ]] || { echo "veth pairs unavailable: $err"; exit 1; }
    ;;
  run)
    [[ $# -ge 3 ]] || die "usage: run N CMD..."
    n=$2; shift 2
    if ! why=$("$0" check); then echo "SKIP: multi-host tests: $why"; exit 77; fi
    "$0" reap
    prefix="psmh$$"
    trap '"$0" down "$prefix"' EXIT
    trap 'exit 143' TERM
    trap 'exit 130' INT
    trap 'exit 129' HUP
    up "$prefix" "$n"
    PAGEDSERVE_NETNS_SCRIPT=$(readlink -f "$0")
    export PAGEDSERVE_NETNS_SCRIPT PAGEDSERVE_NETNS_PREFIX="$prefix" PAGEDSERVE_NETNS_HOSTS="$n"
    rc=0
    "$@" || rc=$?
    exit "$rc"
    ;;
  *) sed -n '2,32p' "$0"; exit 2 ;;
esac
