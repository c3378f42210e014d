package verbs_test

import (
	"context"
	"fmt"
	"time"

	"github.com/goxrc/goxrc/verbs"
)

// Example opens the first RDMA device, registers memory and waits briefly
// for completions. It prints nothing on a host without RDMA, and the
// device's name and limits on one, so it is compiled, not run.
func Example() {
	devs, err := verbs.Devices()
	if err != nil || len(devs) == 0 {
		return // no RDMA here
	}
	ctx, err := verbs.OpenDevice(devs[0].Name)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ctx.Close()

	attr, err := ctx.QueryDevice()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s: max QPs %d, XRC %v\n", ctx.Name(), attr.MaxQP, attr.XRC())

	pd, err := ctx.AllocPD()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pd.Close()
	mr, err := pd.RegMR(1<<20, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		fmt.Println(err) // ENOMEM: over RLIMIT_MEMLOCK (ulimit -l)
		return
	}
	defer mr.Close()
	copy(mr.Bytes(), "registered, outside the Go heap")

	ch, err := ctx.NewCompChannel()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ch.Close()
	cq, err := ctx.CreateCQ(256, ch, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cq.Close()

	// QPs go here: pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: cq, ...}),
	// Modify through INIT/RTR/RTS with verbs.RequiredMask, then PostSend/PostRecv.

	wait, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	wcs := make([]verbs.WorkCompletion, 16)
	n, err := cq.Wait(wait, wcs)
	fmt.Println(n, err != nil) // nothing was posted: the wait times out
}
