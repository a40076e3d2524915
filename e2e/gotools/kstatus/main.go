// Command kstatus prints what the kstatus library computes for Kubernetes objects.
//
// Why it exists: Flux's health checks and other kstatus users decide whether an InferenceService
// is InProgress, Current or Failed from its conditions and observedGeneration; the integration
// tests need that verdict from the library itself, not from a re-implementation of its rules.
//
// Input on stdin: one JSON object, or a List (as `kubectl get -o json` prints). Output: one JSON
// line per object, {"kind", "namespace", "name", "status", "message"}. Exit 1 on unreadable input.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

// maxInput bounds what is read from stdin; a List of a few thousand objects fits.
const maxInput = 64 << 20

type verdict struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Status    string `json:"status"`
	Message   string `json:"message"`
}

func run(in io.Reader, out io.Writer) error {
	raw, err := io.ReadAll(io.LimitReader(in, maxInput+1))
	if err != nil {
		return err
	}
	if len(raw) > maxInput {
		return fmt.Errorf("input larger than %d bytes", maxInput)
	}
	doc := &unstructured.Unstructured{}
	if err := doc.UnmarshalJSON(raw); err != nil {
		return fmt.Errorf("not a Kubernetes object or List: %w", err)
	}
	objects := []unstructured.Unstructured{*doc}
	if doc.IsList() {
		list, err := doc.ToList()
		if err != nil {
			return err
		}
		objects = list.Items
	}
	enc := json.NewEncoder(out)
	for i := range objects {
		obj := &objects[i]
		result, err := status.Compute(obj)
		if err != nil {
			return fmt.Errorf("%s %s/%s: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
		}
		if err := enc.Encode(verdict{obj.GetKind(), obj.GetNamespace(), obj.GetName(),
			result.Status.String(), result.Message}); err != nil {
			return err
		}
	}
	return nil
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
}
