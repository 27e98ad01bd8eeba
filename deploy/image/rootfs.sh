#!/bin/sh
# rootfs.sh DIR assembles the files of dedupflow's container image in DIR: the
# static binary, CA certificates, time zone data and a non-root user. The
# Dockerfile runs it in its build stage; CI runs the same script on the host and
# feeds DIR to the Dockerfile's final stage (--build-arg ROOTFS=prebuilt), since
# it cannot pull the build stage's base image.
set -eu
out=${1:?usage: rootfs.sh DIR}
cd "$(dirname "$0")/../.."
certs=${CA_CERTIFICATES:-/etc/ssl/certs/ca-certificates.crt}
zoneinfo=${ZONEINFO_DIR:-/usr/share/zoneinfo}
[ -f "$certs" ] || { echo "rootfs.sh: no CA certificates at $certs (install ca-certificates)" >&2; exit 1; }
[ -f "$zoneinfo/UTC" ] || { echo "rootfs.sh: no time zone data in $zoneinfo (install tzdata)" >&2; exit 1; }

mkdir -p "$out/usr/local/bin" "$out/etc/ssl/certs" "$out/usr/share" "$out/tmp"
# GOWORK=off: the binary is built from its module's go.mod alone, without the
# workspace's bench module (go.work).
GOWORK=off CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out/usr/local/bin/dedupflow" ./cmd/dedupflow
cp "$certs" "$out/etc/ssl/certs/ca-certificates.crt"
cp -R "$zoneinfo" "$out/usr/share/zoneinfo"
# 65532 is the "nonroot" user of distroless images, so volume permissions
# prepared for those fit this image too.
echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$out/etc/passwd"
echo 'nonroot:x:65532:' >"$out/etc/group"
mkdir -p "$out/home/nonroot"
chmod 1777 "$out/tmp"
