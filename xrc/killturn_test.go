package xrc

import (
	"context"
	"errors"
	"testing"
)

// TestSendWaitingForTurnSaysProcessDeathFromKillOn: a Send that finds the
// turn taken after the Kill, its ctx ended, says ErrProcessDied, as after
// die (c.done) and as the credit wait does. It said ctx's error: its
// doc promises why the connection ended once it has.
func TestSendWaitingForTurnSaysProcessDeathFromKillOn(t *testing.T) {
	a, ca := deathHeldPair(t, 195, nil, nil)
	ca.turn <- struct{}{} // another Send's post holds the turn
	defer ca.endTurn()
	a.p.Kill()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ca.Send(done, []byte("x")); !errors.Is(err, ErrProcessDied) {
		t.Errorf("Send waiting for its turn after the process's kill: %v, want ErrProcessDied (Err: %v)", err, ca.Err())
	}
}
