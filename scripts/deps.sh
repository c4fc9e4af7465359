#!/usr/bin/env bash
# `make deps`: installs what a fresh Debian machine lacks, with apt-get as root (otherwise prints
# the commands to run). Fast and silent when everything is present.
#   redis-server (the distribution's main suite), valkey-server (Debian 12: bookworm-backports,
#   added as a sources entry if missing; later releases: main), libclang-dev (bindgen),
#   postgresql and python3-venv (other helpers of the project use them).
set -euo pipefail

main_pkgs=(redis-server libclang-dev postgresql python3-venv)
missing=()
for p in "${main_pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
need_valkey=0
command -v valkey-server >/dev/null 2>&1 || need_valkey=1

if [ "${#missing[@]}" -eq 0 ] && [ "$need_valkey" = 0 ]; then
  exit 0
fi

codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
# Debian 12 has Valkey only in backports; its priority (100) keeps every other package on main.
backports=""
if [ "$need_valkey" = 1 ] && [ "$codename" = bookworm ]; then
  backports="bookworm-backports"
fi
sources=/etc/apt/sources.list.d/debian-backports.sources
has_backports() {
  grep -rqsE "(^|[[:space:]])${backports}([[:space:]]|$)" /etc/apt/sources.list /etc/apt/sources.list.d/
}

if [ "$(id -u)" != 0 ]; then
  echo "deps: missing: ${missing[*]} $([ "$need_valkey" = 1 ] && echo valkey-server)"
  echo "deps: run as root (sudo make deps), or:"
  if [ -n "$backports" ] && ! has_backports; then
    echo "  add the ${backports} suite to ${sources} (Types: deb, Suites: ${backports}, Components: main)"
  fi
  [ "${#missing[@]}" -gt 0 ] && echo "  apt-get install -y ${missing[*]}"
  if [ "$need_valkey" = 1 ]; then
    echo "  apt-get install -y valkey-server${backports:+/$backports}"
  fi
  exit 1
fi

if [ -n "$backports" ] && ! has_backports; then
  # The same mirror and key as the main suite's entry.
  uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  echo "deps: adding ${backports} (${uri:-http://deb.debian.org/debian}) as ${sources}"
  cat >"$sources" <<SRC
Types: deb
URIs: ${uri:-http://deb.debian.org/debian}
Suites: ${backports}
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi

export DEBIAN_FRONTEND=noninteractive
echo "deps: installing ${missing[*]} $([ "$need_valkey" = 1 ] && echo valkey-server)"
apt-get update -qq
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ "$need_valkey" = 1 ]; then
  apt-get install -y -qq --no-install-recommends "valkey-server${backports:+/$backports}" >/dev/null
fi
