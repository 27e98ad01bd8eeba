# The dedupflow image: the static binary, CA certificates, time zone data and a
# non-root user, on an empty base. Build it from source with
#
#   docker build -t dedupflow .
#
# CI cannot pull base images, so it builds the files of the image with
# deploy/image/rootfs.sh on the host (the script the build stage runs here) and
# gives them to the same final stage with --build-arg ROOTFS=prebuilt (see
# scripts/test.sh and the README's "Container image").
ARG GO_IMAGE=golang:1.26-bookworm
ARG ROOTFS=source

FROM ${GO_IMAGE} AS source
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN sh deploy/image/rootfs.sh /rootfs

# Files assembled outside the build (a folder "prebuilt" in the context).
FROM scratch AS prebuilt
COPY prebuilt/ /rootfs/

FROM ${ROOTFS} AS rootfs

FROM scratch
COPY --from=rootfs /rootfs/ /
ENV PATH=/usr/local/bin \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
WORKDIR /home/nonroot
# The metrics, /healthz and /readyz port; give --metrics-addr 0.0.0.0:9464 (the
# default listens on loopback only).
EXPOSE 9464
ENTRYPOINT ["dedupflow"]
