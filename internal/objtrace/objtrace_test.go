package objtrace

import (
	"os"
	"strings"
	"testing"
)

// makeWidget creates obj from a frame of its own, which the report must name.
func makeWidget(c *Counter, obj any) { c.Created(obj) }

func TestCounterCountsAndReportsWhereObjectsCameFrom(t *testing.T) {
	c := &Counter{Kind: "widget"}
	early := new(int)
	if !Enabled() {
		// Back to off for the next run of -count: Enable is for good.
		t.Cleanup(func() {
			tracing.Store(false)
			mu.Lock()
			traced = nil
			mu.Unlock()
		})
	}
	if os.Getenv(EnvVar) == "" {
		if Enabled() {
			t.Fatal("tracing on without Enable or " + EnvVar)
		}
		c.Created(early)
		if got := Report(); !strings.Contains(got, "tracing is off") || !strings.Contains(got, EnvVar) {
			t.Fatalf("report with tracing off: %q", got)
		}
	} else {
		c.Created(early) // traced; destroyed below like the rest
	}

	Enable()
	if !Enabled() {
		t.Fatal("Enable did not turn tracing on")
	}
	one := new(int)
	makeWidget(c, one)
	three := []*int{new(int), new(int), new(int)}
	for _, p := range three {
		c.Created(p) // one line: one group of three
	}
	if got := c.Load(); got != 5 {
		t.Fatalf("Load = %d, want 5", got)
	}
	r := Report()
	for _, want := range []string{
		"1 widget created at\n\tgithub.com/goxrc/goxrc/internal/objtrace.makeWidget ",
		"3 widget created at\n\tgithub.com/goxrc/goxrc/internal/objtrace.TestCounterCountsAndReportsWhereObjectsCameFrom ",
		"objtrace_test.go:",
	} {
		if !strings.Contains(r, want) {
			t.Errorf("report lacks %q:\n%s", want, r)
		}
	}
	if strings.Contains(r, "testing.tRunner") || strings.Contains(r, "runtime.goexit") {
		t.Errorf("report keeps the runtime's and testing's frames:\n%s", r)
	}

	c.Destroyed(one)
	for _, p := range three {
		c.Destroyed(p)
	}
	c.Destroyed(early) // created before tracing: uncounted, nothing to forget
	if got := c.Load(); got != 0 {
		t.Fatalf("Load = %d after every object went, want 0", got)
	}
	if got := Report(); got != "no traced object is live" {
		t.Fatalf("report with nothing live: %q", got)
	}
}
