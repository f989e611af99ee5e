# The agent image: one static binary (the BPF object is embedded), the lean
# build: every command but image and run, whose IG image store, OCI and
# runtime packages would double the binary and the agent's memory.
#   docker build -t gpu-mem/gpumem:0.1.0 .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN GONOSUMDB=github.com/inspektor-gadget/notation-go go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -tags lean -o /gpumem ./cmd/gpumem

FROM scratch
COPY --from=build /gpumem /gpumem
USER 0
ENTRYPOINT ["/gpumem"]
CMD ["agent"]
