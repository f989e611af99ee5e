# The agent image: one binary (the BPF object is embedded), the lean build:
# every command but image and run, whose IG image store, OCI and runtime
# packages would double the binary and the agent's memory. Built without
# cgo, it is still linked against the C library, to load the driver's NVML
# (libnvidia-ml.so.1, mounted by the NVIDIA container toolkit) at run time:
# the image carries the build's dynamic loader and the C libraries NVML needs.
#   docker build -t gpu-mem/gpumem:0.1.0 .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN GONOSUMDB=github.com/inspektor-gadget/notation-go go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -tags lean -o /gpumem ./cmd/gpumem

FROM scratch
COPY --from=build /lib64/ld-linux-x86-64.so.2 /lib64/
COPY --from=build /lib/x86_64-linux-gnu/libc.so.6 /lib/x86_64-linux-gnu/libdl.so.2 /lib/x86_64-linux-gnu/libpthread.so.0 \
     /lib/x86_64-linux-gnu/libm.so.6 /lib/x86_64-linux-gnu/librt.so.1 /lib/x86_64-linux-gnu/
COPY --from=build /gpumem /gpumem
USER 0
ENTRYPOINT ["/gpumem"]
CMD ["agent"]
