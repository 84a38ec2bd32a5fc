#!/bin/sh
# Fetch onnxruntime's C API headers from Debian trixie's libonnxruntime-dev (1.21, ORT_API_VERSION 21) into DEST.
#
# Usage: kernels/fetch_ort_headers.sh DEST
#
# Why 1.21: a custom-op library built against the oldest header it supports works on every newer runtime (the
# OrtApi table is append-only), so evonnx builds against 1.21 and runs on any onnxruntime >= 1.21.
#
# How: the first non-security stanza of /etc/apt/sources.list.d/debian.sources gives the mirror (so no host name
# is written here); its Suites line is rewritten to trixie. apt-get runs with every Dir::* state path pointed into
# a temporary folder, so the system's apt lists, status and cache are never touched; proxies and other settings
# from /etc/apt/apt.conf.d still apply. Works as root and as an ordinary user.
#
# The headers land flat in DEST (onnxruntime_c_api.h, ...) and DEST/.ort-headers is written last as the stamp;
# when the stamp exists the script exits at once.
set -eu

die() {
    echo "fetch_ort_headers: $*" >&2
    exit 1
}

[ $# -eq 1 ] || die "usage: $0 DEST"
dest=$1
stamp="$dest/.ort-headers"
[ -f "$stamp" ] && exit 0

sources=/etc/apt/sources.list.d/debian.sources
[ -r "$sources" ] || die "cannot read $sources (need a Debian host with deb822 sources);" \
    "set EVONNX_ORT_HEADERS to a folder holding onnxruntime_c_api.h (API 21) instead"
for tool in apt-get dpkg-deb awk; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found; set EVONNX_ORT_HEADERS to a header folder instead"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/evonnx-ort-headers.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

mkdir -p "$work/etc/sources.list.d" "$work/etc/preferences.d" "$work/lists/partial" \
    "$work/cache/archives/partial" "$work/download"
: >"$work/status"
: >"$work/etc/sources.list"

# Stanzas are separated by blank lines; keep the first whose URIs do not name the security archive.
awk -v RS= '
    !done && $0 !~ /URIs:[^\n]*security/ {
        n = split($0, lines, "\n")
        for (i = 1; i <= n; i++) {
            if (lines[i] ~ /^Suites:/) lines[i] = "Suites: trixie"
            if (lines[i] !~ /^#/) printf "%s\n", lines[i]
        }
        done = 1
    }' "$sources" >"$work/etc/sources.list.d/trixie.sources"
grep -q '^URIs:' "$work/etc/sources.list.d/trixie.sources" ||
    die "no non-security stanza with a URIs: line in $sources"

# apt drops privileges to _apt for downloads when run as root; that user must own the partial folders.
if [ "$(id -u)" -eq 0 ] && id _apt >/dev/null 2>&1; then
    chown -R _apt "$work/lists" "$work/cache" "$work/download"
fi

set -- \
    -o "Dir::Etc::SourceList=$work/etc/sources.list" \
    -o "Dir::Etc::SourceParts=$work/etc/sources.list.d" \
    -o "Dir::Etc::Preferences=$work/etc/preferences" \
    -o "Dir::Etc::PreferencesParts=$work/etc/preferences.d" \
    -o "Dir::State::Lists=$work/lists" \
    -o "Dir::State::Status=$work/status" \
    -o "Dir::Cache=$work/cache"

apt-get -q "$@" update >"$work/update.log" 2>&1 ||
    die "apt-get update for trixie failed (network or proxy?):
$(tail -n 20 "$work/update.log")"
(cd "$work/download" && apt-get -q "$@" download libonnxruntime-dev) >"$work/download.log" 2>&1 ||
    die "apt-get download libonnxruntime-dev failed:
$(tail -n 20 "$work/download.log")"

deb=$(ls "$work/download"/libonnxruntime-dev_*.deb 2>/dev/null | head -n 1)
[ -n "$deb" ] || die "apt-get download produced no libonnxruntime-dev .deb"
dpkg-deb -x "$deb" "$work/root" || die "cannot unpack $deb"
inc="$work/root/usr/include/onnxruntime"
[ -f "$inc/onnxruntime_c_api.h" ] || die "$deb has no usr/include/onnxruntime/onnxruntime_c_api.h"

mkdir -p "$dest"
cp -R "$inc"/. "$dest"/
echo "$(basename "$deb")" >"$stamp"
