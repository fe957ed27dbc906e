//go:build !(pmix && cgo)

package bootstrap

import (
	"context"

	"github.com/hashicorp/go-hclog"
)

// openPMIx, in a binary without the pmix backend, refuses the PMIx
// launcher that started the process with a message saying how to rebuild.
func openPMIx(_ context.Context, _ hclog.Logger, st *openState) (Bootstrap, error) {
	return nil, errPMIxNotBuilt(st.env)
}
