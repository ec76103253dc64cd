#!/usr/bin/env bash
# Installs the system programs the test suite runs for real: PostgreSQL 15 server binaries, OpenSSH's sshd,
# promtool (Debian's `prometheus` package), Chromium (the web console's browser tests,
# driven by Playwright through its executable_path), wrk and systemd-analyze (Debian's `systemd`: it verifies the agent's
# unit files without systemd running), valgrind (benchmarks/request_path_cost.py counts the request path's
# instructions under callgrind, in .ci/run), Node.js (20 or newer) and npm, which run the npm clients of
# tests/clients, iproute2 and util-linux's unshare/nsenter (tests/hosts: several hosts on this machine, each a
# network and PID namespace), HAProxy (tests/controller/test_control_plane_upgrade*.py: two routers behind
# a load balancer's health check during a rolling upgrade), debootstrap (tests/hosts/test_server_init.py:
# `llmgw server init` on a minimal Debian tree, made once and cached under ~/.cache/llmgw; it downloads from
# deb.debian.org), git (its daemon serves the starter repo to the standby `llmgw server add` makes there). Nothing is started here: the tests start their own PostgreSQL (initdb + pg_ctl on
# a free port) and sshd (own config on a loopback port).
set -euo pipefail
need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || need+=(iproute2)
{ command -v unshare && command -v nsenter; } >/dev/null 2>&1 || need+=(util-linux)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v wrk >/dev/null 2>&1 || need+=(wrk)
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
command -v git >/dev/null 2>&1 || need+=(git)
command -v valgrind >/dev/null 2>&1 || need+=(valgrind)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
# Node.js and npm: tests/clients drives the openai Node SDK and the Vercel AI SDK (`make node-clients`).
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ ${#need[@]} -eq 0 ]; then
  echo "system deps: all present"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "system deps: installing ${need[*]}"
$sudo apt-get update -q
# The Debian packages start no service here (no systemd), and we want none started where systemd runs.
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${need[@]}"
