package harness

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// linkChanges are test/softroce's functions that make or remove RDMA links
// and veths, of fixed names: the whole guest sees them.
var linkChanges = []string{"Setup", "SetupVeth", "AddLink", "DeleteLink", "DeleteVeth"}

// sysctls is where a test that changes a sysctl (the ephemeral port range)
// writes.
const sysctls = "/proc/sys/"

// changesShared returns, for each Test function of the Go package in dir,
// what it does to the whole guest (a call of linkChanges, or a path under
// sysctls), reached through the package's functions (called or passed as
// values): the first found, "" for none.
func changesShared(t *testing.T, dir string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	funcs := map[string]*ast.FuncDecl{}
	for _, name := range files {
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
				funcs[fd.Name.Name] = fd
			}
		}
	}
	var reach func(name string, seen map[string]bool) string
	reach = func(name string, seen map[string]bool) (found string) {
		seen[name] = true
		ast.Inspect(funcs[name], func(n ast.Node) bool {
			if found != "" {
				return false
			}
			switch x := n.(type) {
			case *ast.SelectorExpr:
				if id, ok := x.X.(*ast.Ident); ok && id.Name == "softroce" && slices.Contains(linkChanges, x.Sel.Name) {
					found = "softroce." + x.Sel.Name
				}
			case *ast.BasicLit:
				if strings.Contains(x.Value, sysctls) {
					found = x.Value
				}
			case *ast.Ident:
				if funcs[x.Name] != nil && !seen[x.Name] {
					found = reach(x.Name, seen)
				}
			}
			return found == ""
		})
		return found
	}
	out := map[string]string{}
	for name := range funcs {
		if strings.HasPrefix(name, "Test") && name != "TestMain" {
			out[name] = reach(name, map[string]bool{})
		}
	}
	return out
}

// TestBesideRunsNoSharedChanges: the -race build of test/integration runs
// beside its plain build in one guest (test/run-tests.sh, BESIDE_PKG), so a
// test that makes or removes a device of a fixed name, or changes a sysctl,
// must not run in both at once: the -race build runs it later, alone
// (BESIDE_ALONE), and the plain build skips one that changes a sysctl
// (PLAIN_SKIP). TestCMDeviceRemovalAfterEnds ran in both: each made and
// deleted rxerm0 and its veth, which the other's removal tests use.
func TestBesideRunsNoSharedChanges(t *testing.T) {
	// run-tests.sh's settings (its lines up to the first command): the
	// package, the -race build's -test.run and -test.skip beside the plain
	// build, and the plain build's -test.skip; an empty skip skips nothing.
	out, err := exec.Command("bash", "-c", `set -eu
eval "$(sed -n '/^VM_PACKAGES=/,/^VM_TIMEOUT=/p' ../run-tests.sh)"
spec() { for s; do [[ ${s%%=*} != "$BESIDE_PKG" ]] || { [[ $s != *=* ]] || echo "${s#*=}"; return; }; done; echo '^$'; }
skip=$(spec "${VM_RACE_SKIP[@]}")
skip=${skip:+$skip|}$BESIDE_ALONE
printf '%s\n' "$BESIDE_PKG" "$(spec "${VM_RACE[@]}")" "${skip:-^$}" "${PLAIN_SKIP:-^$}"`).CombinedOutput()
	if err != nil {
		t.Fatalf("reading test/run-tests.sh: %v: %s", err, out)
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("reading test/run-tests.sh: %q", out)
	}
	var re [3]*regexp.Regexp
	for i, l := range lines[1:] {
		re[i] = regexp.MustCompile(l)
	}
	raceRun, raceSkip, plainSkip := re[0], re[1], re[2]
	checked := 0
	for name, change := range changesShared(t, filepath.Join("../..", lines[0])) {
		if change == "" {
			continue
		}
		checked++
		if raceRun.MatchString(name) && !raceSkip.MatchString(name) {
			t.Errorf("%s (%s) runs in the -race build beside the plain one: add it to BESIDE_ALONE", name, change)
		}
		if strings.Contains(change, sysctls) && !plainSkip.MatchString(name) {
			t.Errorf("%s (%s) changes a sysctl: add it to PLAIN_SKIP", name, change)
		}
	}
	if checked == 0 {
		t.Fatalf("no test in %s changes what the guest shares: the search is broken", lines[0])
	}
}
