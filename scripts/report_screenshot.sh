#!/usr/bin/env bash
# Renders a `shardtrain report` page to a PNG with headless Chromium, to look at a
# report on a machine without a browser (or to attach one to an issue). Installs
# Debian's `chromium` with apt-get when it is missing (sudo when not root).
#
#   scripts/report_screenshot.sh report.html [out.png] [WIDTH,HEIGHT]
#
# out.png defaults to the report's name with .png; the window defaults to 1400,3000
# (CSS pixels; the page lays its plots out two to a row at this width). The PNG is
# written beside its final name and renamed into place, so a failure leaves none.
set -euo pipefail

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
if [ $# -lt 1 ] || [ $# -gt 3 ]; then usage >&2; exit 2; fi
html=$1
png=${2:-${html%.html}.png}
size=${3:-1400,3000}
[ -f "$html" ] || { echo "report_screenshot: $html: no such file" >&2; exit 2; }
[[ "$size" =~ ^[0-9]+,[0-9]+$ ]] || { echo "report_screenshot: window size '$size' must be WIDTH,HEIGHT" >&2; exit 2; }
out_dir=$(dirname -- "$png")
[ -d "$out_dir" ] || { echo "report_screenshot: $out_dir: no such directory" >&2; exit 2; }
[ -d "$png" ] && { echo "report_screenshot: $png is a directory" >&2; exit 2; }

if ! command -v chromium >/dev/null 2>&1; then
  echo "report_screenshot: installing chromium (Debian package)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi

page="file://$(realpath -- "$html")"
final=$(realpath -m -- "$png")
tmp_png="$(dirname -- "$final")/.$(basename -- "$final").tmp-$$.png"
profile=$(mktemp -d)
log=$(mktemp)
trap 'rm -rf -- "$profile" "$log" "$tmp_png"' EXIT

# Each run gets a fresh profile directory, so nothing of a user's Chromium is read.
if ! chromium --headless --disable-gpu --no-sandbox --hide-scrollbars --user-data-dir="$profile" \
    --screenshot="$tmp_png" --window-size="$size" "$page" >"$log" 2>&1 || [ ! -s "$tmp_png" ]; then
  echo "report_screenshot: chromium did not write a screenshot of $html:" >&2
  cat "$log" >&2
  exit 1
fi
mv -f -- "$tmp_png" "$final"
echo "report_screenshot: $final ($size)"
