//go:build fuzzseed

// The seed corpora of kube's fuzz targets (testdata/fuzz), written by
// go generate -tags fuzzseed (make fuzz-seeds), not by go test.

package kube

//go:generate go test -tags fuzzseed -run ^TestWriteSeeds$ -count=1 .

import (
	"encoding/base64"
	"testing"
	"testing/cryptotest"

	"github.com/gpu-mem/gpu-mem/internal/fuzzseed"
)

const (
	seedUID = "5f3b8a1e-2c4d-4e6f-8a0b-1c2d3e4f5a6b"
	seedID  = "3f8a2b1c9d0e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a"
	otherID = "aaaa2b1c9d0e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a"
)

// TestWriteSeeds writes FuzzKubeconfig's, FuzzPodList's and FuzzWatch's
// seeds.
func TestWriteSeeds(t *testing.T) {
	cryptotest.SetGlobalRandom(t, 1) // the same CA each time
	ca := seedCA(t)
	caData := base64.StdEncoding.EncodeToString(ca)
	kubeconfigs := map[string]string{
		// TestPodsKubeconfig's.
		"relative-files": `apiVersion: v1
kind: Config
clusters:
- {name: other, cluster: {server: "https://192.0.2.1:6443"}}
- {name: test, cluster: {server: "https://127.0.0.1:35431", certificate-authority: ca.crt}}
users: [{name: admin, user: {client-certificate: admin.crt, client-key: admin.key}}]
contexts:
- {name: other, context: {cluster: other, user: admin}}
- {name: test, context: {cluster: test, user: admin}}
current-context: test
`,
		// As kubeadm and kind write them.
		"embedded-data": `apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: ` + caData + `
    server: https://kind-control-plane:6443
  name: kind-kind
contexts:
- context:
    cluster: kind-kind
    user: kind-kind
  name: kind-kind
current-context: kind-kind
kind: Config
preferences: {}
users:
- name: kind-kind
  user:
    client-certificate-data: ` + caData + `
    client-key-data: ` + base64.StdEncoding.EncodeToString([]byte("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIA==\n-----END EC PRIVATE KEY-----\n")) + `
`,
		// As az aks get-credentials and aws eks update-kubeconfig write them.
		"exec-plugin": `apiVersion: v1
kind: Config
clusters:
- name: aks
  cluster: {server: "https://aks-dns-1a2b3c.hcp.eastus.azmk8s.io:443", certificate-authority-data: ` + caData + `}
contexts: [{name: aks, context: {cluster: aks, user: clusterUser}}]
current-context: aks
users:
- name: clusterUser
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: kubelogin
      args: [get-token, --login, azurecli, --server-id, 6dae42f8-4368-4678-94ff-3960e28e3630]
      env: [{name: AAD_LOGIN_METHOD, value: azurecli}]
      interactiveMode: IfAvailable
`,
		"token":         "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: https://k/, insecure-skip-tls-verify: true}}]\nusers: [{name: u, user: {token: abc}}]\n",
		"token-file":    "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: https://k, tls-server-name: api}}]\nusers: [{name: u, user: {tokenFile: /var/run/token}}]\n",
		"basic-auth":    "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: https://k}}]\nusers: [{name: u, user: {username: admin, password: secret}}]\n",
		"auth-provider": "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: https://k}}]\nusers: [{name: u, user: {auth-provider: {name: gcp}}}]\n",
		"no-context":    "current-context: missing\n",
		"aliases":       "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ncontexts: [*d]\n",
	}
	var configs []fuzzseed.Seed
	for name, kc := range kubeconfigs {
		configs = append(configs, fuzzseed.Of(name, []byte(kc)))
	}
	fuzzseed.Write(t, "FuzzKubeconfig", configs)

	full := podJSONFull
	lists := []fuzzseed.Seed{
		fuzzseed.Of("test-list", []byte(`{"kind":"PodList","metadata":{"resourceVersion":"10"},"items":[`+podJSON("uid-1", "trainer-5d9f8-x2x7z", "9", "c1")+`]}`)),
		fuzzseed.Of("full-pod", []byte(`{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"48213","continue":"eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NDgyMTMsInN0YXJ0IjoidmxsbS0wXHUwMDAwIn0"},"items":[`+full+`]}`)),
		fuzzseed.Of("empty", []byte(`{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`)),
		// Found: a status's "containerd://" without an ID named the pod's
		// processes outside any container (the sandbox's) after it. Fixed:
		// an empty ID is left out.
		fuzzseed.Of("regression-empty-container-id", []byte(`{"items":[{"metadata":{"uid":"u"},"status":{"containerStatuses":[{"name":"x","containerID":"containerd://"}]}}]}`)),
	}
	fuzzseed.Write(t, "FuzzPodList", lists)

	watches := []fuzzseed.Seed{
		fuzzseed.Of("test-events", []byte(`{"type":"ADDED","object":`+podJSON("uid-2", "other", "11", "c2")+"}\n"+
			`{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"12"}}}`+"\n"+
			`{"type":"DELETED","object":`+podJSON("uid-1", "trainer-5d9f8-x2x7z", "13", "c1")+"}\n")),
		fuzzseed.Of("full-pod", []byte(`{"type":"MODIFIED","object":`+full+"}\n")),
		fuzzseed.Of("expired", []byte(`{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 10 (48213)","reason":"Expired","code":410}}`+"\n")),
	}
	fuzzseed.Write(t, "FuzzWatch", watches)
}

// podJSONFull is a v1 Pod as the API server sends it (a vLLM server of a
// Deployment, with an init container), trimmed of nothing gpu-mem skips.
const podJSONFull = `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"vllm-7c9d5b8f4-qx2lp","generateName":"vllm-7c9d5b8f4-","namespace":"inference","uid":"` + seedUID + `","resourceVersion":"48190","creationTimestamp":"2026-11-30T09:12:44Z","labels":{"app":"vllm","pod-template-hash":"7c9d5b8f4"},"annotations":{"kubectl.kubernetes.io/restartedAt":"2026-11-30T09:12:40Z"},"ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"vllm-7c9d5b8f4","uid":"0b8e2f6a-9d41-4c3b-a6e2-7f1d9c0b5e33","controller":true,"blockOwnerDeletion":true}],"managedFields":[{"manager":"kube-controller-manager","operation":"Update","apiVersion":"v1","time":"2026-11-30T09:12:44Z","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:generateName":{},"f:labels":{".":{},"f:app":{}}}}}]},"spec":{"volumes":[{"name":"shm","emptyDir":{"medium":"Memory","sizeLimit":"16Gi"}}],"initContainers":[{"name":"fetch-weights","image":"busybox:1.36","command":["sh","-c","true"],"resources":{}}],"containers":[{"name":"vllm","image":"vllm/vllm-openai:v0.11.0","args":["--model","Qwen/Qwen3-8B","--gpu-memory-utilization","0.9"],"ports":[{"containerPort":8000,"protocol":"TCP"}],"resources":{"limits":{"nvidia.com/gpu":"1"},"requests":{"nvidia.com/gpu":"1"}}}],"restartPolicy":"Always","nodeName":"gpu-node-1","schedulerName":"default-scheduler","tolerations":[{"key":"nvidia.com/gpu","operator":"Exists","effect":"NoSchedule"}]},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True","lastTransitionTime":"2026-11-30T09:14:02Z"}],"hostIP":"10.224.0.5","podIP":"10.244.1.17","startTime":"2026-11-30T09:12:44Z","initContainerStatuses":[{"name":"fetch-weights","state":{"terminated":{"exitCode":0,"reason":"Completed","startedAt":"2026-11-30T09:12:46Z","finishedAt":"2026-11-30T09:12:47Z","containerID":"containerd://` + otherID + `"}},"ready":true,"restartCount":0,"image":"docker.io/library/busybox:1.36","imageID":"docker.io/library/busybox@sha256:9ae97d36d26566ff84e8893c64a6dc4fe8ca6d1144bf5b87b2b85a32def253c7","containerID":"containerd://` + otherID + `","started":false}],"containerStatuses":[{"name":"vllm","state":{"running":{"startedAt":"2026-11-30T09:12:50Z"}},"ready":true,"restartCount":0,"image":"docker.io/vllm/vllm-openai:v0.11.0","imageID":"docker.io/vllm/vllm-openai@sha256:1b6b5f1b5d1c1f0e5a6b5c1d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f","containerID":"containerd://` + seedID + `","started":true}],"qosClass":"BestEffort"}}`
