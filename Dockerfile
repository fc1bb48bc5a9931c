# weft's node image, built from this repository:
#
#   docker build -t ghcr.io/weft-net/weft:0.1.0 .
#
# Stage 1 compiles the TypeScript and bundles the CNI plugin (npm ci runs our `prepare`: tsc →
# dist/, esbuild → dist/weft-cni.cjs) and builds the native parts (our `install` script:
# node-gyp against libmnl and libbpf → native/build/Release/weft.node, the TUN helper the js
# engine uses without the addon → native/build/weft-tun, and the bpf engine's programs, clang
# -target bpf → native/build/weft.bpf.o), then drops the dev dependencies. Stage 2 is the
# runtime: Node 20 on Debian with libmnl, libbpf, iproute2 (ip and bridge: the kernel ops without
# the addon), iptables and nftables (--ip-masq). The DaemonSet (deploy/kubernetes/weft.yml) runs
# /opt/weft/bin/weft; its init container installs dist/weft-cni.cjs on the host. The bpf
# programs' source ships beside their object: the engine refuses an object built from another.
# test/unit/deploy/manifests.test.ts checks this file against the files the runtime loads.
FROM node:20-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libmnl-dev libbpf-dev clang python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/weft
COPY package.json package-lock.json tsconfig.json tsconfig.build.json ./
COPY scripts ./scripts
COPY native/binding.gyp ./native/binding.gyp
COPY native/src ./native/src
COPY native/tun-helper ./native/tun-helper
COPY native/bpf ./native/bpf
COPY src ./src
COPY bin ./bin
# node-gyp builds against the image's own Node headers (no download).
ENV npm_config_nodedir=/usr/local
RUN npm ci \
 && test -f native/build/Release/weft.node \
 && test -f native/build/weft-tun \
 && test -f native/build/weft.bpf.o \
 && test -f dist/control/main.js \
 && test -f dist/weft-cni.cjs \
 && npm prune --omit=dev \
 && rm -rf native/build/Release/obj.target native/build/Release/.deps

FROM node:20-bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libmnl0 libbpf1 iproute2 iptables nftables ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/weft
COPY --from=build /opt/weft/package.json ./package.json
COPY --from=build /opt/weft/bin ./bin
COPY --from=build /opt/weft/dist ./dist
COPY --from=build /opt/weft/node_modules ./node_modules
COPY --from=build /opt/weft/native/build/Release/weft.node ./native/build/Release/weft.node
COPY --from=build /opt/weft/native/build/weft-tun ./native/build/weft-tun
COPY --from=build /opt/weft/native/build/weft.bpf.o ./native/build/weft.bpf.o
COPY --from=build /opt/weft/native/bpf ./native/bpf
ENTRYPOINT ["/opt/weft/bin/weft"]
CMD ["daemon", "--help"]
