package main

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/goxrc/goxrc/internal/mainexec"
)

// The xrc mode without -fabric prints the transport each connection got
// ("10.7.0.1:7471: connected over XRC"; over RC, cm's log line says why),
// but its -json held only the mode, the address list, the size, the count
// and the time: a script asking which transport it got had to read the
// text on stderr. The JSON carries each connection in "conns", as the
// fabric demo's carries each node in "nodes": its address, its transport
// and, over RC, why. The run dials two servers on the in-memory fabric,
// which carries XRC.
func TestXRCModeJSONHasTransports(t *testing.T) {
	addrs := []string{"10.7.0.1:7471", "10.7.0.2:7471"}
	mainexec.Child("client", func() { onFabric(-1, addrs...); main() })
	t.Setenv(dirEnv, t.TempDir())
	args := "-mode xrc -addr " + strings.Join(addrs, ",") + " -progress 0"
	stdout, stderr, code := mainexec.Run(t, args)
	for _, a := range addrs {
		if code != 0 || !strings.Contains(stdout, a+": connected over XRC") {
			t.Fatalf("%s: exit status %d, stdout %q, stderr %q; want %s connected over XRC", args, code, stdout, stderr, a)
		}
	}
	stdout, stderr, code = mainexec.Run(t, args+" -json")
	var got struct {
		Count int `json:"count"`
		Conns []struct {
			Addr      string  `json:"addr"`
			Transport string  `json:"transport"`
			Reason    *string `json:"reason"`
		} `json:"conns"`
	}
	if err := json.Unmarshal([]byte(stdout), &got); err != nil || code != 0 {
		t.Fatalf("%s -json: exit status %d, stdout %q (%v), stderr %q", args, code, stdout, err, stderr)
	}
	if got.Count != len(addrs) || len(got.Conns) != len(addrs) {
		t.Fatalf("%s -json: %s, want %d connections in conns", args, stdout, len(addrs))
	}
	for i, c := range got.Conns {
		if c.Addr != addrs[i] || c.Transport != "XRC" || c.Reason != nil {
			t.Errorf("%s -json: conns[%d] %+v, want %s over XRC, no reason", args, i, c, addrs[i])
		}
	}
}

// Over RC (a device without XRC, or a peer with no XRC listener: not on
// the fabric, which carries XRC) the reason in "conns" is the one cm logs,
// read from the Dial's log as its lines go on to the text output.
func TestReasonHandler(t *testing.T) {
	var text strings.Builder
	var reason string
	log := slog.New(reasonHandler{slog.NewTextHandler(&text, nil), &reason})
	log.Debug("XRC refused by the peer's CM recently, using RC", "reason", "below the text's level")
	if reason != "" {
		t.Fatalf("reason %q from a record the text leaves out", reason)
	}
	// As cm/xrcprobe.go's noXRC logs it.
	log.Info("XRC unavailable, using RC", "device", "rxe0", "reason", "the device has no XRC (IBV_DEVICE_XRC unset)")
	if reason != "the device has no XRC (IBV_DEVICE_XRC unset)" || !strings.Contains(text.String(), `reason="the device has no XRC`) {
		t.Fatalf("reason %q, text %q", reason, text.String())
	}
}
