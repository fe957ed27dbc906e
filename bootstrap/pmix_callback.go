//go:build pmix && cgo

package bootstrap

// This file holds the cgo export alone: a file with //export may declare
// C functions in its preamble but not define them.

/*
#include <stdint.h>
*/
import "C"

// mdPMIxFenceDone is PMIx_Fence_nb's callback, called on the PMIx
// progress thread. It only hands the status over, never blocking that
// thread.
//
//export mdPMIxFenceDone
func mdPMIxFenceDone(status C.int, id C.uintptr_t) {
	fences.complete(uintptr(id), int(status))
}
