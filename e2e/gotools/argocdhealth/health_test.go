// Package argocdhealth runs Kiln's Argo CD health checks through Argo CD's own Lua evaluation.
//
// Why it exists: a health.lua is only as good as the interpreter that runs it. This test does what
// Argo CD's util/lua TestLuaHealthScript does for the checks in Argo CD's repository, with one
// difference: the script reaches the VM as an argocd-cm resource override (the way Kiln documents
// installing it), looked up by the object's group/kind, with the standard libraries closed as in
// production. Every case of every health_test.yaml under -customizations must match exactly.
package argocdhealth

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/argoproj/argo-cd/gitops-engine/v3/pkg/health"
	appv1 "github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

var customizations = flag.String("customizations", "",
	"a directory in Argo CD's resource_customizations layout: <group>/<Kind>/health.lua")

type healthTests struct {
	Tests []struct {
		InputPath    string              `json:"inputPath"`
		HealthStatus health.HealthStatus `json:"healthStatus"`
	} `json:"tests"`
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	if err := yaml.UnmarshalStrict(raw, into); err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
}

func TestHealthScripts(t *testing.T) {
	if *customizations == "" {
		t.Fatal("-customizations is required")
	}
	scripts, err := filepath.Glob(filepath.Join(*customizations, "*", "*", "health.lua"))
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no <group>/<Kind>/health.lua under %s (%v)", *customizations, err)
	}
	for _, script := range scripts {
		dir := filepath.Dir(script)
		groupKind := filepath.ToSlash(strings.TrimPrefix(dir, filepath.Clean(*customizations)+string(filepath.Separator)))
		source, err := os.ReadFile(script)
		if err != nil {
			t.Fatal(err)
		}
		var cases healthTests
		readYAML(t, filepath.Join(dir, "health_test.yaml"), &cases)
		if len(cases.Tests) == 0 {
			t.Fatalf("%s: health_test.yaml has no tests", groupKind)
		}
		for _, tc := range cases.Tests {
			t.Run(groupKind+"/"+tc.InputPath, func(t *testing.T) {
				obj := &unstructured.Unstructured{}
				readYAML(t, filepath.Join(dir, tc.InputPath), &obj.Object)
				key := lua.GetConfigMapKey(obj.GroupVersionKind())
				if key != groupKind {
					t.Fatalf("object is a %s, the script is for %s", key, groupKind)
				}
				vm := lua.VM{ResourceOverrides: map[string]appv1.ResourceOverride{
					key: {HealthLua: string(source)},
				}}
				found, useOpenLibs, err := vm.GetHealthScript(obj)
				if err != nil || found != string(source) {
					t.Fatalf("Argo CD did not find the override for %s: %v", key, err)
				}
				vm.UseOpenLibs = useOpenLibs
				got, err := vm.ExecuteHealthLua(obj, found)
				if err != nil || got == nil {
					t.Fatalf("Argo CD got no health from the script: %v", err)
				}
				if *got != tc.HealthStatus {
					t.Errorf("got %q %q, want %q %q", got.Status, got.Message,
						tc.HealthStatus.Status, tc.HealthStatus.Message)
				}
			})
		}
	}
}
