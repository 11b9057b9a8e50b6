#!/bin/sh
# Fetch the ONNX Runtime C/C++ API headers (API 21) from Debian trixie's libonnxruntime-dev
# 1.21.0+dfsg-1 into a git-ignored folder, without touching the host's apt state or dpkg database
# (docs/native-library.md#build). setup.py runs it; usage: fetch_ort_headers.sh DEST
set -eu
DEST=${1:?usage: fetch_ort_headers.sh DEST}
PACKAGE=libonnxruntime-dev
VERSION=1.21.0+dfsg-1
API=21

if [ -f "$DEST/onnxruntime_c_api.h" ]; then
    exit 0  # cached
fi
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || {
    echo "fetch_ort_headers: needs apt-get and dpkg-deb (Debian/Ubuntu); elsewhere set ONNX_HYBRID_ORT_INCLUDE" \
         "to a directory holding onnxruntime_c_api.h (ORT_API_VERSION $API)" >&2
    exit 1
}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/lists/partial" "$W/cache/archives/partial"
MIRROR=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$MIRROR" ] || MIRROR=$(awk '$1=="deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian
echo "deb $MIRROR trixie main" > "$W/sources.list"
set -- -o Dir::Etc::SourceList="$W/sources.list" -o Dir::Etc::SourceParts=/nonexistent \
       -o Dir::State::Lists="$W/lists" -o Dir::Cache="$W/cache" -o Debug::NoLocking=1
# apt drops privileges to _apt, which cannot write into a 0700 mktemp folder.
[ "$(id -u)" = 0 ] && set -- "$@" -o APT::Sandbox::User=root
apt-get "$@" -qq update
(cd "$W" && apt-get "$@" -qq download "$PACKAGE=$VERSION")
dpkg-deb -x "$W"/${PACKAGE}_*.deb "$W/root"
got=$(sed -n 's/^#define ORT_API_VERSION \([0-9]*\).*/\1/p' "$W/root/usr/include/onnxruntime/onnxruntime_c_api.h")
if [ "$got" != "$API" ]; then
    echo "fetch_ort_headers: expected ORT_API_VERSION $API in $PACKAGE $VERSION, got '$got'" >&2
    exit 1
fi
# onnxruntime_c_api.h marks a complete cache (above and in build_config.py), so it is copied last: an
# interrupted copy is fetched again instead of being taken for a cache.
HEADERS="$W/root/usr/include/onnxruntime"
mv "$HEADERS/onnxruntime_c_api.h" "$W/onnxruntime_c_api.h"
mkdir -p "$DEST"
cp -r "$HEADERS/." "$DEST/"
cp "$W/root/usr/share/doc/$PACKAGE/copyright" "$DEST/COPYRIGHT.debian" 2>/dev/null || true
cp "$W/onnxruntime_c_api.h" "$DEST/"
echo "fetch_ort_headers: ORT API $API headers from $PACKAGE $VERSION in $DEST"
