// Package fakectl drives the test-only entry points of the fakedat
// stand-in for libdat2 (../../testdata/fakedat/fakedat.c): it injects the
// asynchronous errors and connection events that a test cannot provoke
// through DAT (a broken endpoint, an overflowed or failing EVD, a dead
// IA), and counts the events an EVD still holds.
//
// The package exists because test files cannot use cgo. Only the udapl
// package's tests import it. It refers to the fake's symbols weakly, so a
// test binary linked against the real libdat2 still links; there [Loaded]
// reports false and every call returns [ErrNotFake].
//
// It is built with the udapl tag and cgo, like package udapl; without them
// it is empty.
package fakectl
