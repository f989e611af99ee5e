// Package kube watches the pods of one node through the Kubernetes API
// server (in-cluster or from a kubeconfig), so that a process's cgroup
// (its pod UID and container ID) is named: namespace, pod, container and
// workload, and the pods' gpu-mem annotations are read. The agent uses it
// directly; operators/k8smeta adapts it to Inspektor Gadget.
package kube
