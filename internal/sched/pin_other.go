//go:build !linux

package sched

import "errors"

// PinThread binds the calling goroutine's thread to cpu where the system
// allows it; here it does not.
func PinThread(cpu int) (restore func(), err error) {
	return nil, errors.New("sched: binding a thread to a CPU needs Linux")
}
