package harness

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var (
	citedName   = regexp.MustCompile(`\b(?:Test|Fuzz|Benchmark)[A-Z][A-Za-z0-9_]*`)
	definedName = regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)[A-Za-z0-9_]*)\(`)
)

// citedHistory are names the docs cite that no test has, on purpose: a doc
// comment's sample test, and a test a later one replaced, told as history.
var citedHistory = []string{"TestConnect", "TestFlowControlAbandonedSend"}

// TestDocsCiteTestsThatExist: every test, fuzz target and benchmark that
// README.md, docs/ (but its measurement logs, which are history) and the
// packages' doc.go name is one the tree has, or the prefix of some (the
// docs give "TestReal*" or a -run pattern), so that a renamed or removed
// test does not leave a reader looking for it.
func TestDocsCiteTestsThatExist(t *testing.T) {
	root := filepath.Join("..", "..")
	var defined []string
	cited := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && path != root {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		name := d.Name()
		isDoc := rel == "README.md" || name == "doc.go" ||
			filepath.Dir(rel) == "docs" && strings.HasSuffix(name, ".md") && !strings.HasSuffix(name, "-log.md")
		if !isDoc && !strings.HasSuffix(name, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.HasSuffix(name, "_test.go") {
			for _, m := range definedName.FindAllSubmatch(b, -1) {
				defined = append(defined, string(m[1]))
			}
		}
		if isDoc {
			for _, m := range citedName.FindAll(b, -1) {
				cited[string(m)] = append(cited[string(m)], rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(defined) < 100 || len(cited) < 50 {
		t.Fatalf("found %d tests and %d cited names: the walk missed the tree", len(defined), len(cited))
	}
	for name, where := range cited {
		if slices.Contains(citedHistory, name) || slices.ContainsFunc(defined, func(d string) bool { return strings.HasPrefix(d, name) }) {
			continue
		}
		t.Errorf("%s: cites %s, which no test is or begins", strings.Join(slices.Compact(slices.Sorted(slices.Values(where))), ", "), name)
	}
}
