// Command koordinator-review answers one AdmissionReview with Koordinator v1.8.0's own webhook
// handlers, built through Koordinator's own handler registration (package webhook's
// HandlerBuilderMap), against a fake client holding the same state files `koord-webhook review`
// reads. It is the reference side of the differential harness (conformance/README.md).
//
// Input on stdin, one JSON object:
//
//	{"path": "/validate-pod", "gates": {"EnableQuotaAdmission": true}, "objects": [...], "review": {...}}
//
// Output on stdout, one JSON object: allowed, code, message, warnings, and the patched object (the
// request's object with the answer's patch applied; null when there is no object or no patch).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	evanphx "github.com/evanphx/json-patch"
	jsonpatch "gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/component-base/featuregate"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache/informertest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/koordinator-sh/koordinator/cmd/koord-manager/options"
	utilfeature "github.com/koordinator-sh/koordinator/pkg/util/feature"
	"github.com/koordinator-sh/koordinator/pkg/util/fieldindex"
	"github.com/koordinator-sh/koordinator/pkg/webhook"
	"github.com/koordinator-sh/koordinator/pkg/webhook/elasticquota"
)

type input struct {
	Path    string                      `json:"path"`
	Gates   map[string]bool             `json:"gates"`
	Objects []map[string]interface{}    `json:"objects"`
	Review  admissionv1.AdmissionReview `json:"review"`
}

type output struct {
	Allowed  bool            `json:"allowed"`
	Code     int32           `json:"code"`
	Message  string          `json:"message"`
	Warnings []string        `json:"warnings"`
	Patched  json.RawMessage `json:"patched"`
	Error    string          `json:"error,omitempty"`
	// Panic is what Koordinator's handler panicked with. Served, the panic would end the
	// connection (controller-runtime re-panics, net/http drops it), so the API server reports a
	// failed call.
	Panic string `json:"panic,omitempty"`
}

// indexes records the field indexes Koordinator registers on its cache, to give them to the fake
// client (whose List with a field selector needs them).
type indexes struct {
	cache.Cache
	fields []index
}

type index struct {
	obj   client.Object
	field string
	fn    client.IndexerFunc
}

// recorded holds Koordinator's field indexes, registered once per process (Koordinator registers
// them only once).
var recorded *indexes

func (i *indexes) IndexField(_ context.Context, obj client.Object, field string, fn client.IndexerFunc) error {
	i.fields = append(i.fields, index{obj, field, fn})
	return nil
}

// fakeManager is the part of a manager the handler builders use: client, scheme and cache.
type fakeManager struct {
	manager.Manager
	client client.Client
	cache  cache.Cache
}

func (m *fakeManager) GetClient() client.Client    { return m.client }
func (m *fakeManager) GetScheme() *runtime.Scheme  { return options.Scheme }
func (m *fakeManager) GetCache() cache.Cache       { return m.cache }
func (m *fakeManager) GetAPIReader() client.Reader { return m.client }

// With --lines, cases come one JSON object after another on stdin and each answer is one line on
// stdout, all in this process: what Koordinator keeps process-wide (feature gates, the quota
// topology) is put back before each case.
func main() {
	klog.SetOutput(io.Discard)
	klog.LogToStderr(false)
	decoder := json.NewDecoder(os.Stdin)
	encoder := json.NewEncoder(os.Stdout)
	lines := len(os.Args) > 1 && os.Args[1] == "--lines"
	touched := map[string]bool{}
	for {
		var c input
		err := decoder.Decode(&c)
		if err == io.EOF && lines {
			return
		}
		if err != nil {
			// The stream cannot be read further.
			_ = encoder.Encode(output{Error: fmt.Sprintf("input: %v", err)})
			return
		}
		out, err := run(c, touched)
		if err != nil {
			out = output{Error: err.Error()}
		}
		_ = encoder.Encode(out)
		if !lines {
			return
		}
	}
}

// reset puts back the gates earlier cases set and drops the quota topology and informer
// Koordinator's quota plugin keeps in a package variable (the next handler builds both anew over
// the new client and informers).
func reset(touched map[string]bool) error {
	defaults := utilfeature.DefaultMutableFeatureGate.GetAll()
	var gates []string
	for name := range touched {
		gates = append(gates, fmt.Sprintf("%s=%t", name, defaults[featuregate.Feature(name)].Default))
	}
	sort.Strings(gates)
	if len(gates) > 0 {
		if err := utilfeature.DefaultMutableFeatureGate.Set(strings.Join(gates, ",")); err != nil {
			return fmt.Errorf("gates reset: %w", err)
		}
	}
	quotas := elasticquota.NewPlugin(nil, nil)
	quotas.QuotaTopo = nil
	quotas.QuotaInformer = nil
	return nil
}

func run(c input, touched map[string]bool) (output, error) {
	if err := reset(touched); err != nil {
		return output{}, err
	}
	gates := make([]string, 0, len(c.Gates))
	for name, on := range c.Gates {
		gates = append(gates, fmt.Sprintf("%s=%t", name, on))
		touched[name] = true
	}
	sort.Strings(gates)
	if len(gates) > 0 {
		if err := utilfeature.DefaultMutableFeatureGate.Set(strings.Join(gates, ",")); err != nil {
			return output{}, fmt.Errorf("gates: %w", err)
		}
	}

	objects := make([]client.Object, 0, len(c.Objects))
	informers := &informertest.FakeInformers{Scheme: options.Scheme}
	for _, raw := range c.Objects {
		typed, err := typedObject(raw)
		if err != nil {
			return output{}, err
		}
		objects = append(objects, typed)
	}
	if recorded == nil {
		recorded = &indexes{}
		if err := fieldindex.RegisterFieldIndexes(recorded); err != nil {
			return output{}, fmt.Errorf("field indexes: %w", err)
		}
	}
	builder := fake.NewClientBuilder().WithScheme(options.Scheme).WithObjects(objects...)
	for _, i := range recorded.fields {
		builder = builder.WithIndex(i.obj, i.field, i.fn)
	}
	cl := builder.Build()

	hb, ok := webhook.HandlerBuilderMap[c.Path]
	if !ok {
		return output{}, fmt.Errorf("no Koordinator handler at %s", c.Path)
	}
	handler := hb.WithControllerManager(&fakeManager{client: cl, cache: informers}).Build()
	// The elastic quota handlers learn the tree from informer events: replay the state into them.
	for _, o := range objects {
		if inf, err := informers.FakeInformerFor(context.Background(), o); err == nil {
			inf.Add(o)
		}
	}

	req := admission.Request{AdmissionRequest: *c.Review.Request}
	resp, panicked := handle(handler, req)
	if panicked != "" {
		return output{Panic: panicked}, nil
	}
	result := output{Allowed: resp.Allowed, Warnings: resp.Warnings}
	if resp.Result != nil {
		result.Code = resp.Result.Code
		result.Message = resp.Result.Message
	}
	if len(resp.Patches) > 0 && len(req.Object.Raw) > 0 {
		patched, err := applyPatches(req.Object.Raw, resp.Patches)
		if err != nil {
			return output{}, err
		}
		result.Patched = patched
	}
	return result, nil
}

// handle answers the request, or returns what the handler panicked with.
func handle(handler admission.Handler, req admission.Request) (resp admission.Response, panicked string) {
	defer func() {
		if r := recover(); r != nil {
			panicked = fmt.Sprint(r)
		}
	}()
	return handler.Handle(context.Background(), req), ""
}

func typedObject(raw map[string]interface{}) (client.Object, error) {
	u := &unstructured.Unstructured{Object: raw}
	obj, err := options.Scheme.New(u.GroupVersionKind())
	if err != nil {
		return nil, fmt.Errorf("state object %s: %w", u.GroupVersionKind(), err)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, obj); err != nil {
		return nil, fmt.Errorf("state object %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	typed, ok := obj.(client.Object)
	if !ok {
		return nil, fmt.Errorf("state object %s is not a client.Object", u.GroupVersionKind())
	}
	typed.SetResourceVersion("")
	return typed, nil
}

func applyPatches(original []byte, patches []jsonpatch.JsonPatchOperation) (json.RawMessage, error) {
	doc, err := json.Marshal(patches)
	if err != nil {
		return nil, err
	}
	patch, err := evanphx.DecodePatch(doc)
	if err != nil {
		return nil, err
	}
	return patch.Apply(original)
}
