// A Go peer for the benchmark: the same /validate-pod QoS rules (spec 2.3) and /mutate-pod with one
// ClusterColocationProfile and batch conversion (spec 1.2), on controller-runtime's webhook server,
// which is what Koordinator's webhook runs on. Not part of the product.
package main

import (
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"github.com/go-logr/logr"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"

	"encoding/json"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

var decoder = admission.NewDecoder(runtime.NewScheme())

const (
	qosLabel      = "koordinator.sh/qosClass"
	priorityLabel = "koordinator.sh/priority-class"
	batchCPU      = "kubernetes.io/batch-cpu"
	batchMemory   = "kubernetes.io/batch-memory"
)

func priorityClass(pod *corev1.Pod) string {
	if v, ok := pod.Labels[priorityLabel]; ok {
		switch v {
		case "koord-prod", "koord-mid", "koord-batch", "koord-free":
			return v
		}
		return ""
	}
	if pod.Spec.Priority == nil {
		return ""
	}
	p := *pod.Spec.Priority
	switch {
	case p >= 9000 && p <= 9999:
		return "koord-prod"
	case p >= 7000 && p <= 7999:
		return "koord-mid"
	case p >= 5000 && p <= 5999:
		return "koord-batch"
	case p >= 3000 && p <= 3999:
		return "koord-free"
	}
	return ""
}

func qosClass(pod *corev1.Pod) string {
	switch v := pod.Labels[qosLabel]; v {
	case "LSE", "LSR", "LS", "BE", "SYSTEM":
		return v
	}
	return ""
}

func podRequests(pod *corev1.Pod) corev1.ResourceList {
	total := corev1.ResourceList{}
	for _, c := range pod.Spec.Containers {
		for k, v := range c.Resources.Requests {
			q := total[k]
			q.Add(v)
			total[k] = q
		}
	}
	for k, v := range pod.Spec.Overhead {
		q := total[k]
		q.Add(v)
		total[k] = q
	}
	return total
}

func validatePod(_ context.Context, req admission.Request) admission.Response {
	pod := &corev1.Pod{}
	if err := decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	var errs []string
	qos, pc := qosClass(pod), priorityClass(pod)
	requests := podRequests(pod)
	cpuBatch, memBatch := requests[batchCPU], requests[batchMemory]
	if (!cpuBatch.IsZero() || !memBatch.IsZero()) && qos != "BE" {
		errs = append(errs, "labels.koordinator.sh/qosClass: Required value: must specify koordinator QoS BE with koordinator colocation resources")
	}
	if (qos == "BE" && (pc == "" || pc == "koord-prod")) || (qos == "LSR" && pc != "koord-prod") {
		errs = append(errs, fmt.Sprintf("Pod: Forbidden: koordinator.sh/qosClass=%s and priorityClass=%s cannot be used in combination", qos, pc))
	}
	if qos == "LSR" || qos == "LSE" {
		cpu := requests[corev1.ResourceCPU]
		if cpu.IsZero() {
			errs = append(errs, "pod.spec.containers[*].resources.requests: Required value: LSR Pod must declare the requested CPUs")
		} else if cpu.MilliValue()%1000 != 0 {
			errs = append(errs, fmt.Sprintf("pod.spec.containers[*].resources.requests: Invalid value: %q: the requested CPUs of LSR Pod must be integer", cpu.String()))
		}
	}
	switch len(errs) {
	case 0:
		return admission.Allowed("")
	case 1:
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("%s", errs[0]))
	}
	return admission.Errored(http.StatusBadRequest, fmt.Errorf("%v", errs))
}

func convert(list corev1.ResourceList) {
	if q, ok := list[corev1.ResourceCPU]; ok {
		list[batchCPU] = *resource.NewQuantity(q.MilliValue(), resource.DecimalSI)
		delete(list, corev1.ResourceCPU)
	}
	if q, ok := list[corev1.ResourceMemory]; ok {
		list[batchMemory] = q
		delete(list, corev1.ResourceMemory)
	}
}

// mutatePod applies the benchmark's one profile: pods labelled app=spark become BE batch pods.
func mutatePod(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	pod := &corev1.Pod{}
	if err := decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if pod.Labels["app"] != "spark" {
		return admission.Allowed("")
	}
	original, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	pod.Labels[qosLabel] = "BE"
	pod.Labels["koordinator.sh/priority"] = strconv.Itoa(1111)
	pod.Spec.SchedulerName = "koord-scheduler"
	pod.Spec.PriorityClassName = "koord-batch"
	priority := int32(5500)
	pod.Spec.Priority = &priority
	for i := range pod.Spec.Containers {
		r := &pod.Spec.Containers[i].Resources
		if r.Requests != nil {
			convert(r.Requests)
		}
		if r.Limits != nil {
			convert(r.Limits)
		}
		for _, name := range []corev1.ResourceName{batchCPU, batchMemory} {
			if l, ok := r.Limits[name]; ok {
				if r.Requests == nil {
					r.Requests = corev1.ResourceList{}
				}
				if _, ok := r.Requests[name]; !ok {
					r.Requests[name] = l
				}
			}
		}
	}
	mutated, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(original, mutated)
}

// floorReview is all the floor webhook reads of a request: the uid its answer must carry.
type floorReview struct {
	Request struct {
		UID string `json:"uid"`
	} `json:"request"`
}

// floor answers "allowed" without looking at the object: what any webhook costs at the least.
func floor(w http.ResponseWriter, r *http.Request) {
	var in floorReview
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	allow(w, in.Request.UID, "")
}

// allow writes an "allowed" answer for uid, with patch (base64 of a JSON patch) when there is one.
func allow(w http.ResponseWriter, uid, patch string) {
	w.Header().Set("Content-Type", "application/json")
	if patch == "" {
		fmt.Fprintf(w, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":%q,"allowed":true}}`, uid)
		return
	}
	fmt.Fprintf(w, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":%q,"allowed":true,"patchType":"JSONPatch","patch":%q}}`, uid, patch)
}

// patchFloor answers like floor, with one difference at /mutate-pod: once mutatePod has made a
// patch (the first pod a profile selects; the benchmark's warm-up pods before it need none and get
// mutatePod's own answer), that patch is the answer to every later pod, a constant. The benchmark's
// Koordinator pods differ only in their generated names, which the patch does not touch, so the API
// server applies the patch a real answer carries while the webhook reads nothing but the uid: what
// applying Koordinator's patch costs the API server, at the least. Meant for the Koordinator
// workload: a plain pod sent after it would be given the same patch.
type patchFloor struct {
	mu    sync.RWMutex
	patch string // base64 of the JSON patch, once one was made
}

func (p *patchFloor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var in floorReview
	if err == nil {
		err = json.Unmarshal(body, &in)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p.mu.RLock()
	patch := p.patch
	p.mu.RUnlock()
	if patch == "" {
		if patch, err = firstPatch(r.Context(), body); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if patch != "" {
			p.mu.Lock()
			p.patch = patch
			p.mu.Unlock()
		}
	}
	allow(w, in.Request.UID, patch)
}

// firstPatch is mutatePod's patch for the review in body, base64-encoded; empty when it makes none.
func firstPatch(ctx context.Context, body []byte) (string, error) {
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		return "", err
	}
	if review.Request == nil {
		return "", fmt.Errorf("no request in the review")
	}
	answer := mutatePod(ctx, admission.Request{AdmissionRequest: *review.Request})
	if len(answer.Patches) == 0 {
		return "", nil
	}
	ops, err := json.Marshal(answer.Patches)
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(ops), nil
}

func main() {
	port := flag.Int("port", 9444, "HTTPS port")
	certDir := flag.String("cert-dir", ".", "directory with tls.crt and tls.key")
	host := flag.String("host", "127.0.0.1", "address to listen on (0.0.0.0 in a Pod)")
	floorMode := flag.Bool("floor", false, "answer allowed at both paths without reading the object")
	patchMode := flag.Bool("floor-patch", false, "as --floor, and /mutate-pod answers every pod with the first patch mutatePod made")
	flag.Parse()
	ctrl.SetLogger(logr.Discard())
	server := webhook.NewServer(webhook.Options{Port: *port, CertDir: *certDir, Host: *host})
	if *patchMode {
		server.Register("/validate-pod", http.HandlerFunc(floor))
		server.Register("/mutate-pod", &patchFloor{})
	} else if *floorMode {
		server.Register("/validate-pod", http.HandlerFunc(floor))
		server.Register("/mutate-pod", http.HandlerFunc(floor))
	} else {
		server.Register("/validate-pod", &webhook.Admission{Handler: admission.HandlerFunc(validatePod)})
		server.Register("/mutate-pod", &webhook.Admission{Handler: admission.HandlerFunc(mutatePod)})
	}
	if err := server.Start(ctrl.SetupSignalHandler()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
