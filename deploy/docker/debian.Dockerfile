# gpu-health-local/debian:bookworm - the local base every stand-in builds on: the
# debootstrap rootfs (scripts/compose-images.sh) plus the host's CA certificates,
# so build steps that reach a package registry trust what the host trusts.
FROM gpu-health-local/debian-rootfs:bookworm
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
# No package caches in any layer built on this one.
RUN printf '%s\n' 'Dir::Cache::pkgcache "";' 'Dir::Cache::srcpkgcache "";' 'APT::Keep-Downloaded-Packages "false";' \
      > /etc/apt/apt.conf.d/90-gpu-health-no-cache \
    && apt-get update -qq && apt-get install -y -qq --no-install-recommends ca-certificates >/dev/null \
    && rm -rf /var/lib/apt/lists/*
COPY --from=hostca . /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null
# Tools (pip, Java, curl) read the system bundle instead of a copy of their own.
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
