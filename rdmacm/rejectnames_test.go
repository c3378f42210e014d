package rdmacm

import (
	"fmt"
	"testing"
)

func TestRejectReasonNames(t *testing.T) {
	for _, c := range []struct {
		v    int
		want string
	}{
		{RejectNoQP, "no QP"},
		{RejectNoEEC, "no EEC"},
		{RejectNoResources, "no resources"},
		{RejectTimeout, "timeout"},
		{RejectUnsupported, "unsupported request"},
		{RejectInvalidCommID, "invalid communication id"},
		{RejectInvalidCommInst, "invalid communication instance"},
		{RejectInvalidServiceID, "invalid service id (no listener)"},
		{RejectInvalidTransport, "invalid transport type"},
		{RejectStaleConn, "stale connection"},
		{RejectRDCNotExist, "RDC does not exist"},
		{RejectInvalidGID, "invalid GID"},
		{RejectInvalidLID, "invalid LID"},
		{RejectInvalidSL, "invalid SL"},
		{RejectInvalidTrafficCls, "invalid traffic class"},
		{RejectInvalidHopLimit, "invalid hop limit"},
		{RejectInvalidPacketRate, "invalid packet rate"},
		{RejectPortCMRedirect, "port CM redirect"},
		{RejectPortRedirect, "port redirect"},
		{RejectInvalidMTU, "invalid MTU"},
		{RejectInsufficientRespRs, "insufficient responder resources"},
		{RejectConsumerDefined, "consumer defined"},
		{RejectInvalidRNRRetry, "invalid RNR retry"},
		{RejectDuplicateLocalComm, "duplicate local communication id"},
		{RejectInvalidClassVer, "invalid class version"},
		{RejectInvalidFlowLabel, "invalid flow label"},
		{RejectInvalidAltFlowLbl, "invalid alternate flow label"},
		{18, "RejectReason(18)"},
	} {
		if got := fmt.Sprint(RejectReason(c.v)); got != c.want {
			t.Errorf("RejectReason(%d) prints %q, want %q", c.v, got, c.want)
		}
	}
}

func TestSIDRStatusNames(t *testing.T) {
	for _, c := range []struct {
		v    int
		want string
	}{
		{SIDRUnsupported, "service not supported (no listener)"},
		{SIDRReject, "rejected"},
		{SIDRNoQP, "no QP"},
		{SIDRRedirect, "redirect"},
		{SIDRUnsupportedVersion, "unsupported version"},
		{6, "SIDRStatus(6)"},
	} {
		if got := fmt.Sprint(SIDRStatus(c.v)); got != c.want {
			t.Errorf("SIDRStatus(%d) prints %q, want %q", c.v, got, c.want)
		}
	}
}
