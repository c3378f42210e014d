package softroce

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"strings"
	"testing"
	"testing/fstest"
)

// sysfs lays out /sys/class/infiniband for rxe0 on veth0 (10.77.0.1) and a
// device without a parent file whose GID 0 entry is unpopulated.
var sysfs = fstest.MapFS{
	"rxe0/parent":                       {Data: []byte("veth0\n")},
	"rxe0/ports/1/gid_attrs/ndevs/0":    {Data: []byte("veth0\n")},
	"rxe0/ports/1/gids/0":               {Data: []byte("fe80:0000:0000:0000:9403:5fff:feb8:92e1\n")},
	"rxe0/ports/1/gids/1":               {Data: []byte("0000:0000:0000:0000:0000:ffff:0a4d:0001\n")},
	"mlx5_0/ports/1/gid_attrs/ndevs/10": {Data: []byte("eth9\n")},
	"mlx5_0/ports/1/gid_attrs/ndevs/2":  {Data: []byte("eth1\n")},
	"mlx5_0/ports/1/gid_attrs/ndevs/0":  {Data: []byte("")},
	"mlx5_0/ports/1/gids/0":             {Data: []byte("0000:0000:0000:0000:0000:0000:0000:0000\n")},
	"bare/ports/1/gids/0":               {Data: []byte("fe80:0000:0000:0000:0000:0000:0000:0001\n")},
}

func TestNetdevOf(t *testing.T) {
	for dev, want := range map[string]string{"rxe0": "veth0", "mlx5_0": "eth1", "bare": "", "missing": ""} {
		if got := netdevOf(sysfs, dev); got != want {
			t.Errorf("netdevOf(%s) = %q, want %q", dev, got, want)
		}
	}
}

func TestIPv4FromGIDs(t *testing.T) {
	if a, ok := ipv4FromGIDs(sysfs, "rxe0"); !ok || a != netip.MustParseAddr("10.77.0.1") {
		t.Errorf("rxe0: got %v %v, want 10.77.0.1", a, ok)
	}
	for _, dev := range []string{"mlx5_0", "bare", "missing"} {
		if a, ok := ipv4FromGIDs(sysfs, dev); ok {
			t.Errorf("%s: got %v, want none", dev, a)
		}
	}
}

func TestPickIPv4(t *testing.T) {
	p := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, x := range s {
			out = append(out, netip.MustParseAddr(x))
		}
		return out
	}
	cases := []struct {
		in   []netip.Addr
		want string
	}{
		{p("169.254.1.1", "::ffff:10.0.0.5", "10.0.0.6"), "10.0.0.5"},
		{p("fe80::1", "0.0.0.0"), ""},
		{nil, ""},
	}
	for _, c := range cases {
		got, ok := pickIPv4(c.in)
		if (c.want == "") == ok || (ok && got.String() != c.want) {
			t.Errorf("pickIPv4(%v) = %v %v, want %q", c.in, got, ok, c.want)
		}
	}
}

func TestResolve(t *testing.T) {
	rxe0 := []Link{{Name: "rxe0", Netdev: "veth0"}}
	addr := func(dev string) (netip.Addr, error) {
		if dev == "rxe0" {
			return netip.MustParseAddr("10.77.0.1"), nil
		}
		return netip.Addr{}, errors.New(dev + ": netdev eth0 has no IPv4 address")
	}
	devs := []string{"rxe0"}
	cases := []struct {
		name     string
		env      map[string]string
		sysfs    []string // entries of /sys/class/infiniband
		sysfsErr error
		links    []Link
		linksErr error
		wantDev  string
		wantIP   string
		wantSkip string // substring
		wantErr  string // substring
	}{
		{name: "no sysfs", sysfsErr: fs.ErrNotExist, wantSkip: "no RDMA device: /sys/class/infiniband missing"},
		{name: "no sysfs, netlink unavailable", sysfsErr: fs.ErrNotExist, linksErr: errors.New("protocol not supported"), wantSkip: "missing"},
		{name: "sysfs unreadable", sysfsErr: fs.ErrPermission, wantErr: "cannot read /sys/class/infiniband"},
		{name: "empty sysfs", sysfs: []string{}, wantSkip: "no RDMA device: /sys/class/infiniband is empty"},
		{name: "empty sysfs, netlink unavailable", linksErr: errors.New("protocol not supported"), wantSkip: "is empty"},
		{name: "devices, netlink unavailable", sysfs: devs, linksErr: errors.New("protocol not supported"), wantErr: "RDMA links cannot be listed: protocol not supported"},
		{name: "devices, no links", sysfs: devs, wantErr: "lists no RDMA link"},
		{name: "discover", sysfs: devs, links: rxe0, wantDev: "rxe0", wantIP: "10.77.0.1"},
		{name: "discover second", sysfs: []string{"mlx5_0", "rxe0"}, links: []Link{{Name: "mlx5_0"}, rxe0[0]}, wantDev: "rxe0", wantIP: "10.77.0.1"},
		{name: "discover no addr", sysfs: []string{"mlx5_0"}, links: []Link{{Name: "mlx5_0"}}, wantSkip: "RDMA devices, but none with an IPv4 address (mlx5_0: netdev eth0 has no IPv4 address)"},
		{name: "env", env: map[string]string{EnvDev: "rxe0", EnvIP: "10.77.0.9"}, links: rxe0, wantDev: "rxe0", wantIP: "10.77.0.9"},
		{name: "env without ip", env: map[string]string{EnvDev: "rxe0"}, links: rxe0, wantDev: "rxe0", wantIP: "10.77.0.1"},
		{name: "env device missing", env: map[string]string{EnvDev: "rxe7"}, sysfs: devs, links: rxe0, wantErr: "no such RDMA device"},
		{name: "env no rdma at all", env: map[string]string{EnvDev: "rxe0"}, sysfsErr: fs.ErrNotExist, linksErr: errors.New("protocol not supported"), wantErr: "cannot be listed"},
		{name: "env bad ip", env: map[string]string{EnvDev: "rxe0", EnvIP: "10.77.0"}, links: rxe0, wantErr: "RXE_IP"},
		{name: "env no addr", env: map[string]string{EnvDev: "mlx5_0"}, links: []Link{{Name: "mlx5_0"}}, wantErr: "no address found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := probe{
				getenv:     func(k string) string { return c.env[k] },
				sysfs:      func() ([]string, error) { return c.sysfs, c.sysfsErr },
				links:      func() ([]Link, error) { return c.links, c.linksErr },
				addressFor: addr,
			}
			dev, ip, skip, err := p.resolve()
			switch {
			case c.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
			case err != nil:
				t.Fatalf("unexpected error %v", err)
			case c.wantSkip != "":
				if !strings.Contains(skip, c.wantSkip) || !strings.Contains(skip, "test/vm") {
					t.Fatalf("skip = %q, want %q and a hint at test/vm", skip, c.wantSkip)
				}
			case skip != "":
				t.Fatalf("unexpected skip %q", skip)
			case dev != c.wantDev || ip.String() != c.wantIP:
				t.Fatalf("got %s %s, want %s %s", dev, ip, c.wantDev, c.wantIP)
			}
		})
	}
}

func TestVethPairCheck(t *testing.T) {
	if err := DefaultVeth.check(); err != nil {
		t.Fatal(err)
	}
	bad := []VethPair{{}, {Name: "a", Peer: "a", Addr: DefaultVeth.Addr}, {Name: "a", Peer: "b"}}
	for _, v := range bad {
		if v.check() == nil {
			t.Errorf("%+v accepted", v)
		}
	}
}

// TestDeviceSkipsWithoutRDMA runs on hosts without RDMA: Device must skip, not fail.
func TestDeviceSkipsWithoutRDMA(t *testing.T) {
	if os.Getenv(EnvDev) != "" {
		t.Skip("RXE_DEV is set: this test is for machines without RDMA")
	}
	if _, err := os.Stat(SysfsRoot); err == nil {
		t.Skip(SysfsRoot + " exists: this test is for machines without RDMA")
	}
	ran := false
	t.Run("inner", func(t *testing.T) {
		Device(t)
		ran = true
	})
	if ran {
		t.Fatal("Device returned without skipping on a machine without RDMA")
	}
}
