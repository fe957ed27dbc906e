// Package fakectl drives the test-only entry points of the fakeverbs
// stand-in (../../testdata/fakeverbs/fakeverbs.c): it injects the device's
// asynchronous events and connection manager failures that a test cannot
// provoke through the verbs API, and counts the events not yet acked.
//
// The package exists because test files cannot use cgo. Only the verbs
// package's tests import it. It refers to the fake's symbols weakly, so a
// test binary linked against the real libibverbs and librdmacm still links;
// there [Loaded] reports false and every call returns [ErrNotFake].
//
// It is built with the verbs tag and cgo, like package verbs; without them
// it is empty.
package fakectl
