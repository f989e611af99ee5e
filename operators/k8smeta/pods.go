package k8smeta

import (
	"context"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// Pod is what the API server says of a pod.
type Pod struct {
	Namespace, Name string
	Workload        string            // the owner's name (a Deployment's, for its ReplicaSets), else the pod's
	Labels          map[string]string // the pod's labels
	Containers      map[string]string // container ID -> container name
}

// Pods keeps the pods of one node, from a watch on the API server. It is
// safe for concurrent use; a watch that fails is retried, and what was known
// stays until the pod is deleted.
type Pods struct {
	mu    sync.RWMutex
	byUID map[string]Pod
}

// Config finds the API server: kubeconfig when given, else the in-cluster
// configuration; nil when neither exists.
func Config(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	cfg, err := rest.InClusterConfig()
	if err == rest.ErrNotInCluster {
		return nil, nil
	}
	return cfg, err
}

// WatchPods watches the pods scheduled on node until ctx is done.
func WatchPods(ctx context.Context, cfg *rest.Config, node string) (*Pods, error) {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	selector := fields.OneTermEqualSelector("spec.nodeName", node).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return client.CoreV1().Pods("").List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return client.CoreV1().Pods("").Watch(ctx, o)
		},
	}
	p := &Pods{byUID: map[string]Pod{}}
	informer := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 10*time.Minute, cache.Indexers{})
	informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.set(obj) },
		UpdateFunc: func(_, obj any) { p.set(obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				p.mu.Lock()
				delete(p.byUID, string(pod.UID))
				p.mu.Unlock()
			}
		},
	})
	go informer.RunWithContext(ctx)
	// Names from the first interval on, unless the API server does not
	// answer: then the watch goes on retrying.
	synced, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cache.WaitForCacheSync(synced.Done(), informer.HasSynced)
	return p, nil
}

func (p *Pods) set(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	info := Pod{Namespace: pod.Namespace, Name: pod.Name, Workload: workload(pod), Labels: pod.Labels, Containers: map[string]string{}}
	for _, statuses := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, s := range statuses {
			// containerd://ID, cri-o://ID, docker://ID
			if _, id, ok := strings.Cut(s.ContainerID, "://"); ok {
				info.Containers[id] = s.Name
			}
		}
	}
	p.mu.Lock()
	p.byUID[string(pod.UID)] = info
	p.mu.Unlock()
}

// workload names what runs the pod: a Deployment (through its ReplicaSet,
// whose name ends in the template hash), another owner, or the pod itself.
func workload(pod *corev1.Pod) string {
	for _, o := range pod.OwnerReferences {
		if o.Controller == nil || !*o.Controller {
			continue
		}
		if hash := pod.Labels["pod-template-hash"]; o.Kind == "ReplicaSet" && hash != "" {
			return strings.TrimSuffix(o.Name, "-"+hash)
		}
		return o.Name
	}
	return pod.Name
}

// Lookup returns what is known of the pod a container runs in.
func (p *Pods) Lookup(c Container) (Pod, bool) {
	if p == nil || c.PodUID == "" {
		return Pod{}, false
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	pod, ok := p.byUID[c.PodUID]
	return pod, ok
}
