package bitnames

import "testing"

func TestJoin(t *testing.T) {
	names := []Bit{{1, "A"}, {4, "C"}, {2, "B"}}
	for _, c := range []struct {
		v    uint64
		want string
	}{
		{0, "0"}, {1, "A"}, {7, "A|C|B"}, {2 | 8, "B|0x8"}, {0x30, "0x30"},
	} {
		if got := Join(c.v, names); got != c.want {
			t.Errorf("Join(%#x) = %q, want %q", c.v, got, c.want)
		}
	}
}
