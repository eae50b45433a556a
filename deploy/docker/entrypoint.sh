#!/usr/bin/env bash
# Entry point of the pagedserve image (see docs/deploy.md).
#
#   pagedserve-entrypoint serve [FLAGS...]   one pod / one host: mpirun -np 1+TP pagedserve serve
#   pagedserve-entrypoint leader [FLAGS...]  LeaderWorkerSet leader: builds a hostfile from the
#                                            LWS_* variables, waits for the workers' sshd and
#                                            runs mpirun across the group's pods
#   pagedserve-entrypoint worker             LeaderWorkerSet worker: runs a non-root sshd on
#                                            $PAGEDSERVE_SSH_PORT so that the leader's mpirun can
#                                            start its orted here
#   pagedserve-entrypoint drain [SECONDS]    preStop hook: stops admission (SIGTERM to the
#                                            coordinator, rank 0: new requests get 503 / ZeroMQ
#                                            `unavailable`, /health turns 503), then waits until
#                                            its in-flight requests are done and it has exited,
#                                            at most SECONDS (default 240)
#   pagedserve-entrypoint probe-metrics      exits 0 when the metrics endpoint answers 200
#   pagedserve-entrypoint probe-health       `pagedserve client --health` on loopback, with the
#                                            CURVE keys when they are mounted
#   pagedserve-entrypoint CMD [ARGS...]      runs CMD, e.g. `pagedserve client --health`
#
# Environment (all optional):
#   PAGEDSERVE_MODEL                 model file or directory; default: the only *.gguf in
#                                    $PAGEDSERVE_MODEL_DIR, else fetched there when
#                                    PAGEDSERVE_FETCH_MODEL=1 (scripts/fetch-model, SmolLM2)
#   PAGEDSERVE_MODEL_DIR             default /models
#   PAGEDSERVE_TENSOR_PARALLEL_SIZE  default: GPUs visible in this pod (serve) or
#                                    LWS_GROUP_SIZE * PAGEDSERVE_GPUS_PER_POD (leader)
#   PAGEDSERVE_GPUS_PER_POD          GPUs of each pod of a multi-node group (default: visible GPUs)
#   PAGEDSERVE_HTTP_PORT             default 8000 (OpenAI-compatible HTTP API and /health, 0.0.0.0)
#   PAGEDSERVE_ZMQ_PORT              default 5555 (server binds tcp://0.0.0.0:PORT)
#   PAGEDSERVE_METRICS_PORT          default 9400 (bound on 0.0.0.0)
#   PAGEDSERVE_SSH_PORT              default 2222 (multi-node only)
#   PAGEDSERVE_SSH_KEY_DIR           default /etc/pagedserve/ssh: id_ed25519 + id_ed25519.pub
#   PAGEDSERVE_MPI_IFACE             network interface for MPI traffic (default eth0)
#   PAGEDSERVE_WAIT_WORKERS_SECONDS  how long the leader waits for the workers (default 600)
#   PAGEDSERVE_PID_FILE              where the coordinator writes its pid for `drain`
#                                    (default /tmp/pagedserve-coordinator.pid)
#   PAGEDSERVE_SHUTDOWN_GRACE        seconds the coordinator lets in-flight requests finish
#                                    after SIGTERM (default 230, below the drain budget)
#   PAGEDSERVE_MPIRUN_LINGER         seconds mpirun may outlive the coordinator before the
#                                    entry point stops it and exits 1 (default 15; run_mpirun)
#   PAGEDSERVE_CURVE_DIR             default /etc/pagedserve/curve: with server.key_secret (and
#                                    server.key) there, serve turns on CurveZMQ
#   PAGEDSERVE_CURVE_CLIENTS_DIR     default /etc/pagedserve/curve-clients: with *.key files
#                                    there, only those clients (and the probe) are served
#   PAGEDSERVE_TLS_DIR               default /etc/pagedserve/tls: with tls.crt and tls.key there
#                                    (a kubernetes.io/tls Secret), the HTTP API is HTTPS only
set -euo pipefail

log() { echo "pagedserve-entrypoint: $*" >&2; }
die() { log "$*"; exit 1; }

model_dir=${PAGEDSERVE_MODEL_DIR:-/models}
http_port=${PAGEDSERVE_HTTP_PORT:-8000}
zmq_port=${PAGEDSERVE_ZMQ_PORT:-5555}
metrics_port=${PAGEDSERVE_METRICS_PORT:-9400}
ssh_port=${PAGEDSERVE_SSH_PORT:-2222}
ssh_key_dir=${PAGEDSERVE_SSH_KEY_DIR:-/etc/pagedserve/ssh}
iface=${PAGEDSERVE_MPI_IFACE:-eth0}
pid_file=${PAGEDSERVE_PID_FILE:-/tmp/pagedserve-coordinator.pid}
curve_dir=${PAGEDSERVE_CURVE_DIR:-/etc/pagedserve/curve}
curve_clients_dir=${PAGEDSERVE_CURVE_CLIENTS_DIR:-/etc/pagedserve/curve-clients}
tls_dir=${PAGEDSERVE_TLS_DIR:-/etc/pagedserve/tls}

# GPUs this container may use: the NVIDIA device plugin puts the allocated GPUs'
# UUIDs in NVIDIA_VISIBLE_DEVICES; `all` means ask the driver.
visible_gpus() {
  local v=${NVIDIA_VISIBLE_DEVICES:-}
  if [[ -n "$v" && "$v" != all && "$v" != void && "$v" != none ]]; then
    tr ',' '\n' <<<"$v" | grep -c .
  elif command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 0
  else
    echo 0
  fi
}

resolve_model() {
  if [[ -n "${PAGEDSERVE_MODEL:-}" ]]; then
    [[ -e "$PAGEDSERVE_MODEL" ]] || die "PAGEDSERVE_MODEL=$PAGEDSERVE_MODEL does not exist"
    echo "$PAGEDSERVE_MODEL"; return
  fi
  shopt -s nullglob
  local found=("$model_dir"/*.gguf)
  shopt -u nullglob
  if [[ ${#found[@]} -eq 1 ]]; then echo "${found[0]}"; return; fi
  if [[ ${#found[@]} -gt 1 ]]; then
    die "several .gguf files in $model_dir; set PAGEDSERVE_MODEL to one of them"
  fi
  if [[ "${PAGEDSERVE_FETCH_MODEL:-0}" == 1 ]]; then
    log "no model in $model_dir, fetching the default model"
    PAGEDSERVE_MODEL_DIR="$model_dir" /opt/pagedserve/scripts/fetch-model; return
  fi
  die "no model: mount one at $model_dir, set PAGEDSERVE_MODEL, or set PAGEDSERVE_FETCH_MODEL=1"
}

# CurveZMQ flags of serve when the keys are mounted (docs/security.md). The
# allow-list is the mounted client keys plus the server's own public key: the
# ZeroMQ health check `probe-health` uses the server's key pair as its client keys.
curve_flags() {
  [[ -f "$curve_dir/server.key_secret" ]] || return 0
  [[ -f "$curve_dir/server.key" ]] || die "$curve_dir has server.key_secret but no server.key"
  local cflags=(--zmq-curve-secret-key-file "$curve_dir/server.key_secret")
  if compgen -G "$curve_clients_dir/*.key" >/dev/null; then
    local allow=${TMPDIR:-/tmp}/pagedserve-curve-clients
    rm -rf "$allow" && mkdir -p "$allow"
    cp "$curve_clients_dir"/*.key "$allow"/
    cp "$curve_dir/server.key" "$allow/pagedserve-probe.key"
    cflags+=(--zmq-curve-authorized-clients "$allow")
    log "CurveZMQ on; clients allowed: $(cd "$curve_clients_dir" && echo ./*.key)"
  else
    log "CurveZMQ on; any client holding the server's public key is served"
  fi
  echo "${cflags[@]}"
}

tls_flags() {  # --ssl-certfile/--ssl-keyfile when the TLS Secret is mounted (deploy/k8s/components/tls)
  [[ -f "$tls_dir/tls.crt" ]] || return 0
  [[ -f "$tls_dir/tls.key" ]] || die "$tls_dir has tls.crt but no tls.key"
  log "HTTPS on port $http_port with $tls_dir/tls.crt"
  echo --ssl-certfile "$tls_dir/tls.crt" --ssl-keyfile "$tls_dir/tls.key"
}

serve_flags() {  # flags common to single- and multi-node launches
  local model=$1 tp=$2
  echo --model "$model" --tensor-parallel-size "$tp" \
       --host 0.0.0.0 --port "$http_port" \
       --zmq-endpoint "tcp://0.0.0.0:$zmq_port" \
       --metrics-host 0.0.0.0 --metrics-port "$metrics_port" \
       --pid-file "$pid_file" --shutdown-grace "${PAGEDSERVE_SHUTDOWN_GRACE:-230}"
  curve_flags
  tls_flags
}

running() {  # process $1 exists and is not a zombie waiting for its parent to reap it
  local state
  kill -0 "$1" 2>/dev/null || return 1
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 0
  [[ "$state" != Z && "$state" != X ]]
}

# Runs mpirun "$@" and exits with its code. OpenMPI 4.1's mpirun does not
# always exit once the job is over: after a lost host it waits for that host's
# daemon (minutes, until TCP gives up), and it can stay in "abort is already in
# progress" with every rank gone (docs/distributed.md, "Failure paths"). The
# coordinator (rank 0, --pid-file) exits within seconds of any failure, so
# mpirun gets PAGEDSERVE_MPIRUN_LINGER seconds more once the coordinator is
# gone, then SIGTERM and, 5 s later, SIGKILL; the entry point exits 1 and the
# container restarts (a LeaderWorkerSet recreates the group). SIGTERM / SIGINT
# to the entry point (Kubernetes stopping the pod) go to mpirun, as they would
# with `exec mpirun`.
run_mpirun() {
  local linger=${PAGEDSERVE_MPIRUN_LINGER:-15} mpirun_pid coordinator="" gone_at="" rc=0
  # An earlier run's pid file (an emptyDir outlives a container restart) would
  # name a process that is gone, or another one.
  rm -f "$pid_file"
  mpirun "$@" &
  mpirun_pid=$!
  trap 'kill -TERM "$mpirun_pid" 2>/dev/null || true' TERM INT
  while running "$mpirun_pid"; do
    if [[ -z "$coordinator" ]]; then
      coordinator=$(cat "$pid_file" 2>/dev/null || true)
      [[ "$coordinator" =~ ^[0-9]+$ ]] || coordinator=""
    elif [[ -z "$gone_at" ]]; then
      running "$coordinator" || gone_at=$SECONDS
    elif (( SECONDS - gone_at >= linger )); then
      log "mpirun (pid $mpirun_pid) still running ${linger}s after the coordinator (pid" \
        "$coordinator) exited: stopping it"
      kill -TERM "$mpirun_pid" 2>/dev/null || true
      for _ in 1 2 3 4 5; do running "$mpirun_pid" && sleep 1; done
      kill -KILL "$mpirun_pid" 2>/dev/null || true
      wait "$mpirun_pid" 2>/dev/null || true
      exit 1
    fi
    sleep 1
  done
  wait "$mpirun_pid" || rc=$?
  exit "$rc"
}

metrics_body() {  # GET /metrics on loopback with bash's /dev/tcp (no curl in the image)
  local fd
  exec {fd}<>"/dev/tcp/127.0.0.1/$metrics_port" || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&"$fd"
  timeout 5 cat <&"$fd"
  exec {fd}>&-
}

cmd=${1:-serve}
[[ $# -gt 0 ]] && shift

case "$cmd" in
  serve)
    model=$(resolve_model)
    tp=${PAGEDSERVE_TENSOR_PARALLEL_SIZE:-$(visible_gpus)}
    [[ "$tp" -ge 1 ]] 2>/dev/null || tp=1
    # In the main shell, so that a broken CURVE setup stops here instead of serving without it.
    sflags=$(serve_flags "$model" "$tp") || die "cannot build the serve flags"
    log "serving $model with tensor-parallel size $tp ($((tp + 1)) ranks)"
    # Runs as the non-root image user, so OpenMPI needs no root override. --bind-to none: the ranks' threads are
    # placed by the OS inside the pod's cpuset.
    # shellcheck disable=SC2086
    # mpirun forwards SIGTERM to the ranks and SIGKILLs them odls_base_sigkill_timeout
    # seconds later: give rank 0 time to drain (serve's --shutdown-grace) first.
    run_mpirun -np "$((tp + 1))" --bind-to none --map-by slot \
      --mca odls_base_sigkill_timeout "${PAGEDSERVE_SIGKILL_TIMEOUT:-60}" \
      -x PATH -x LD_LIBRARY_PATH -x CUDA_DEVICE_ORDER=PCI_BUS_ID \
      pagedserve serve $sflags "$@"
    ;;

  leader)
    : "${LWS_LEADER_ADDRESS:?leader mode needs the LeaderWorkerSet variables (LWS_LEADER_ADDRESS)}"
    : "${LWS_GROUP_SIZE:?leader mode needs LWS_GROUP_SIZE}"
    gpus=${PAGEDSERVE_GPUS_PER_POD:-$(visible_gpus)}
    [[ "$gpus" -ge 1 ]] 2>/dev/null || die "no GPU visible; set PAGEDSERVE_GPUS_PER_POD"
    tp=${PAGEDSERVE_TENSOR_PARALLEL_SIZE:-$((LWS_GROUP_SIZE * gpus))}
    model=$(resolve_model)
    # Pod DNS names of a group (LWS headless service, subdomainPolicy Shared):
    #   leader   <lws>-<group>.<lws>.<namespace>      = $LWS_LEADER_ADDRESS
    #   worker i <lws>-<group>-<i>.<lws>.<namespace>  for i in 1..size-1
    leader_host=${LWS_LEADER_ADDRESS%%.*}
    domain=${LWS_LEADER_ADDRESS#*.}
    hostfile=$(mktemp /tmp/pagedserve-hostfile.XXXXXX)
    trap 'rm -f "$hostfile"' EXIT
    # The leader runs rank 0 (coordinator) plus `gpus` workers; OpenMPI knows
    # its own short host name as the local node, so no sshd is needed here.
    echo "$(hostname) slots=$((gpus + 1))" > "$hostfile"
    workers=()
    for ((i = 1; i < LWS_GROUP_SIZE; i++)); do
      workers+=("${leader_host}-${i}.${domain}")
      echo "${leader_host}-${i}.${domain} slots=$gpus" >> "$hostfile"
    done
    log "hostfile:"; cat "$hostfile" >&2
    # SSH client setup: key from the Secret, port, no host key pinning inside the group.
    mkdir -p ~/.ssh && chmod 700 ~/.ssh
    install -m 600 "$ssh_key_dir/id_ed25519" ~/.ssh/id_ed25519
    cat > ~/.ssh/config <<CFG
Host *
  Port $ssh_port
  IdentityFile ~/.ssh/id_ed25519
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  ConnectTimeout 10
CFG
    chmod 600 ~/.ssh/config
    deadline=$((SECONDS + ${PAGEDSERVE_WAIT_WORKERS_SECONDS:-600}))
    for w in "${workers[@]}"; do
      until ssh -o BatchMode=yes "$w" true 2>/dev/null; do
        (( SECONDS < deadline )) || die "worker $w: sshd not reachable on port $ssh_port"
        sleep 2
      done
      log "worker $w reachable"
    done
    sflags=$(serve_flags "$model" "$tp") || die "cannot build the serve flags"
    log "serving $model on $LWS_GROUP_SIZE pods, tensor-parallel size $tp ($((tp + 1)) ranks)"
    # shellcheck disable=SC2086
    run_mpirun -np "$((tp + 1))" --hostfile "$hostfile" --map-by slot --bind-to none \
      --mca odls_base_sigkill_timeout "${PAGEDSERVE_SIGKILL_TIMEOUT:-60}" \
      --mca plm_rsh_agent ssh --mca btl_tcp_if_include "$iface" --mca oob_tcp_if_include "$iface" \
      --mca oob_tcp_keepalive_time 10 --mca oob_tcp_keepalive_intvl 2 \
      --mca oob_tcp_keepalive_probes 3 \
      -x PATH -x LD_LIBRARY_PATH -x CUDA_DEVICE_ORDER=PCI_BUS_ID -x NCCL_SOCKET_IFNAME="$iface" \
      pagedserve serve $sflags "$@"
    ;;

  worker)
    # Non-root sshd: host key generated per pod, only the group's key may log in,
    # and only as this same user (a non-root sshd cannot switch users).
    mkdir -p ~/.ssh && chmod 700 ~/.ssh
    install -m 600 "$ssh_key_dir/id_ed25519.pub" ~/.ssh/authorized_keys
    [[ -f ~/.ssh/host_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -f ~/.ssh/host_ed25519
    # Model present before the leader starts mpirun (fetch if asked to).
    resolve_model >/dev/null
    cat > ~/.ssh/sshd_config <<CFG
Port $ssh_port
HostKey $HOME/.ssh/host_ed25519
PidFile $HOME/.ssh/sshd.pid
AuthorizedKeysFile $HOME/.ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UsePAM no
StrictModes no
PermitUserEnvironment no
AllowTcpForwarding no
X11Forwarding no
CFG
    log "sshd on port $ssh_port for the leader's mpirun"
    exec /usr/sbin/sshd -D -e -f ~/.ssh/sshd_config
    ;;

  drain)
    # Kubernetes runs this before it sends SIGTERM to mpirun. SIGTERM to rank 0
    # makes it stop admitting and finish what is in flight (up to its
    # --shutdown-grace), shut the worker ranks down and exit; mpirun then exits.
    budget=${1:-240}
    deadline=$((SECONDS + budget))
    pid=$(cat "$pid_file" 2>/dev/null || true)
    if [[ ! "$pid" =~ ^[0-9]+$ ]] || ! running "$pid"; then
      log "coordinator not running (no live pid in $pid_file); nothing to drain"; exit 0
    fi
    kill -TERM "$pid"
    log "admission stopped (SIGTERM to the coordinator, pid $pid)"
    while running "$pid"; do
      if (( SECONDS >= deadline )); then
        log "drain budget of ${budget}s spent; stopping with requests in flight"; exit 0
      fi
      # The coordinator may exit between the check above and this request: its
      # socket closes under the printf and SIGPIPE ends the subshell (status
      # 141), which `set -e` would make the hook's exit status.
      body=$(metrics_body 2>/dev/null) || body=""
      # Sample lines: name{model_name="..."} value (the value is the last field).
      busy=$(awk '/^pagedserve_requests_(running|waiting|swapped)[{ ]/ {n += $NF} END {print n + 0}' <<<"$body")
      log "waiting for $busy in-flight requests"
      sleep 1
    done
    log "drained: the coordinator has exited"
    ;;

  probe-health)
    probe=(--health --zmq-endpoint "tcp://127.0.0.1:$zmq_port")
    if [[ -f "$curve_dir/server.key_secret" ]]; then
      probe+=(--zmq-curve-server-key-file "$curve_dir/server.key"
              --zmq-curve-secret-key-file "$curve_dir/server.key_secret")
    fi
    exec pagedserve client "${probe[@]}"
    ;;

  probe-metrics)
    body=$(metrics_body) || exit 1
    [[ "$body" =~ ^HTTP/1\.[01]\ 200 ]]
    ;;

  *)
    exec "$cmd" "$@"
    ;;
esac
