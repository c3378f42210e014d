//go:build linux && cgo

package verbs

/*
#include <infiniband/verbs.h>
*/
import "C"

// deviceCapsC pairs each DeviceCap constant with the ibv_device_cap_flags
// value of the same name in <infiniband/verbs.h>, for the test that checks
// them against each other (cgo is not allowed in test files).
var deviceCapsC = []struct {
	goName string
	c      string
	goVal  DeviceCap
	cVal   uint64
}{
	{"DeviceResizeMaxWR", "IBV_DEVICE_RESIZE_MAX_WR", DeviceResizeMaxWR, C.IBV_DEVICE_RESIZE_MAX_WR},
	{"DeviceBadPKeyCntr", "IBV_DEVICE_BAD_PKEY_CNTR", DeviceBadPKeyCntr, C.IBV_DEVICE_BAD_PKEY_CNTR},
	{"DeviceBadQKeyCntr", "IBV_DEVICE_BAD_QKEY_CNTR", DeviceBadQKeyCntr, C.IBV_DEVICE_BAD_QKEY_CNTR},
	{"DeviceRawMulti", "IBV_DEVICE_RAW_MULTI", DeviceRawMulti, C.IBV_DEVICE_RAW_MULTI},
	{"DeviceAutoPathMig", "IBV_DEVICE_AUTO_PATH_MIG", DeviceAutoPathMig, C.IBV_DEVICE_AUTO_PATH_MIG},
	{"DeviceChangePhyPort", "IBV_DEVICE_CHANGE_PHY_PORT", DeviceChangePhyPort, C.IBV_DEVICE_CHANGE_PHY_PORT},
	{"DeviceUDAVPortEnforce", "IBV_DEVICE_UD_AV_PORT_ENFORCE", DeviceUDAVPortEnforce, C.IBV_DEVICE_UD_AV_PORT_ENFORCE},
	{"DeviceCurrQPStateMod", "IBV_DEVICE_CURR_QP_STATE_MOD", DeviceCurrQPStateMod, C.IBV_DEVICE_CURR_QP_STATE_MOD},
	{"DeviceShutdownPort", "IBV_DEVICE_SHUTDOWN_PORT", DeviceShutdownPort, C.IBV_DEVICE_SHUTDOWN_PORT},
	{"DeviceInitType", "IBV_DEVICE_INIT_TYPE", DeviceInitType, C.IBV_DEVICE_INIT_TYPE},
	{"DevicePortActiveEvent", "IBV_DEVICE_PORT_ACTIVE_EVENT", DevicePortActiveEvent, C.IBV_DEVICE_PORT_ACTIVE_EVENT},
	{"DeviceSysImageGUID", "IBV_DEVICE_SYS_IMAGE_GUID", DeviceSysImageGUID, C.IBV_DEVICE_SYS_IMAGE_GUID},
	{"DeviceRCRNRNAKGen", "IBV_DEVICE_RC_RNR_NAK_GEN", DeviceRCRNRNAKGen, C.IBV_DEVICE_RC_RNR_NAK_GEN},
	{"DeviceSRQResize", "IBV_DEVICE_SRQ_RESIZE", DeviceSRQResize, C.IBV_DEVICE_SRQ_RESIZE},
	{"DeviceNNotifyCQ", "IBV_DEVICE_N_NOTIFY_CQ", DeviceNNotifyCQ, C.IBV_DEVICE_N_NOTIFY_CQ},
	{"DeviceMemWindow", "IBV_DEVICE_MEM_WINDOW", DeviceMemWindow, C.IBV_DEVICE_MEM_WINDOW},
	{"DeviceUDIPCsum", "IBV_DEVICE_UD_IP_CSUM", DeviceUDIPCsum, C.IBV_DEVICE_UD_IP_CSUM},
	{"DeviceXRC", "IBV_DEVICE_XRC", DeviceXRC, C.IBV_DEVICE_XRC},
	{"DeviceMemMgtExtensions", "IBV_DEVICE_MEM_MGT_EXTENSIONS", DeviceMemMgtExtensions, C.IBV_DEVICE_MEM_MGT_EXTENSIONS},
	{"DeviceMemWindowType2A", "IBV_DEVICE_MEM_WINDOW_TYPE_2A", DeviceMemWindowType2A, C.IBV_DEVICE_MEM_WINDOW_TYPE_2A},
	{"DeviceMemWindowType2B", "IBV_DEVICE_MEM_WINDOW_TYPE_2B", DeviceMemWindowType2B, C.IBV_DEVICE_MEM_WINDOW_TYPE_2B},
	{"DeviceRCIPCsum", "IBV_DEVICE_RC_IP_CSUM", DeviceRCIPCsum, C.IBV_DEVICE_RC_IP_CSUM},
	{"DeviceRawIPCsum", "IBV_DEVICE_RAW_IP_CSUM", DeviceRawIPCsum, C.IBV_DEVICE_RAW_IP_CSUM},
	{"DeviceManagedFlowSteering", "IBV_DEVICE_MANAGED_FLOW_STEERING", DeviceManagedFlowSteering, C.IBV_DEVICE_MANAGED_FLOW_STEERING},
}
