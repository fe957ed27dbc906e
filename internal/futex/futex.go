// Package futex waits on and wakes a 32-bit word that may live in memory
// shared between processes.
//
// The operations never use FUTEX_PRIVATE_FLAG: the kernel then keys a wait
// queue by the backing page rather than by the address space, so a waiter in
// one process is woken by a Wake in another process that maps the same page
// at a different address.
//
// Wait parks the calling OS thread in the kernel. The Go runtime hands the
// thread's P to another thread meanwhile, so other goroutines keep running,
// but each concurrent waiter costs one OS thread.
//
// On systems without futexes a polling fallback is used: Wait re-reads the
// word every millisecond and Wake does nothing.
//
// # Usage
//
//	seq := atomic.LoadUint32(word)
//	if !ready() { // re-check the condition after reading seq
//		futex.Wait(word, seq, time.Second)
//	}
//
//	// elsewhere
//	makeReady()
//	atomic.AddUint32(word, 1)
//	futex.Wake(word, 1)
package futex
