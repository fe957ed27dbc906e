//go:build !(pmix && cgo)

package bootstrap

import (
	"context"

	"github.com/hashicorp/go-hclog"
)

// openPMIx, in a binary without the pmix backend, refuses the PMIx
// launcher that started the process with a message saying how to rebuild;
// a process a PMIx rank started gets the message it would get in a pmix
// build.
func openPMIx(_ context.Context, _ hclog.Logger, st *openState) (Bootstrap, error) {
	if err := pmixChildErr(st.env); err != nil {
		return nil, err
	}
	return nil, errPMIxNotBuilt(st.env)
}
