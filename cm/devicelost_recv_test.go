package cm

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// A device lost while Recv takes a message: that message is read too, as
// the others taken in are (TestDeviceLostKeepsUnreadMessages). Recv took
// the message off the queue before it took the guard against the release
// (io), so a device loss in between kept copies of the others, gave this
// one's receive buffer back with the device, and Recv said ErrClosed: the
// message was lost, and the next Recv gave the one after it.
func TestDeviceLostDuringRecvLosesNothing(t *testing.T) {
	const rounds, msgs = 200, 60
	want := make([]string, 0, msgs+1)
	for i := range msgs {
		want = append(want, fmt.Sprint("message ", i))
	}
	want = append(want, "peer gone")
	for round := range rounds {
		a, b, _ := fakePair(t, fakeOpts{depth: [2]int{64, 64}})
		ctx := ctxT(t)
		for _, m := range want[:msgs] {
			require.NoError(t, b.Send(ctx, []byte(m)))
		}
		first := make(chan struct{})
		got := make(chan []string)
		go func() {
			buf := make([]byte, 64)
			var read []string
			for {
				n, err := a.Recv(ctx, buf)
				if err != nil {
					got <- append(read, errClass(err))
					return
				}
				read = append(read, string(buf[:n]))
				if len(read) == 1 {
					close(first)
				}
			}
		}()
		<-first
		a.deviceRemoved() // while the reader takes the next ones
		require.Equal(t, want, <-got, "round %d", round)
		<-a.freed
		require.NoError(t, b.Close())
	}
}

// A device lost while a completion round has polled messages and not yet
// handled them: they are read too, then the loss. The round found the
// connection failed and dropped them, though they had arrived whole and
// their buffers were still there (the release waits for the round).
func TestDeviceLostUnderARoundKeepsItsMessages(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{})
	ctx := ctxT(t)
	want := []string{"message 0", "message 1", "message 2"}
	for _, m := range want {
		require.NoError(t, b.Send(ctx, []byte(m)))
	}
	w.mu.Lock()
	w.ends[0].tookCompletions = a.deviceRemoved
	w.mu.Unlock()
	buf := make([]byte, 64)
	var got []string
	for {
		n, err := a.Recv(ctx, buf)
		if err != nil {
			got = append(got, errClass(err))
			break
		}
		got = append(got, string(buf[:n]))
	}
	require.Equal(t, append(want, "peer gone"), got)
	<-a.freed
}
