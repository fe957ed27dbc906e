package adi_test

import (
	"strings"
	"testing"

	"github.com/hpc-multidevice/multidevice/adi"
	"github.com/hpc-multidevice/multidevice/bootstrap"
)

// TestAppNum: the program number comes from WithAppNum, else MD_APPNUM,
// else 0, and a value that is not a number from 0 fails Init naming it.
func TestAppNum(t *testing.T) {
	neg := -1
	for _, tc := range []struct {
		name string
		env  string // "" as good as unset
		opt  *int
		want int
		err  string
	}{
		{"unset", "", nil, 0, ""},
		{"env", "3", nil, 3, ""},
		{"option wins", "3", ptr(5), 5, ""},
		{"option zero", "7", ptr(0), 0, ""},
		{"not a number", "two", nil, 0, `MD_APPNUM="two"`},
		{"negative env", "-2", nil, 0, `MD_APPNUM="-2"`},
		{"fraction", "1.5", nil, 0, `MD_APPNUM="1.5"`},
		{"negative option", "1", &neg, 0, "WithAppNum(-1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("MD_APPNUM", tc.env)
			boots, err := bootstrap.InProcess(1, nil)
			if err != nil {
				t.Fatal(err)
			}
			opts := []adi.Option{adi.WithBootstrap(boots[0])}
			if tc.opt != nil {
				opts = append(opts, adi.WithAppNum(*tc.opt))
			}
			w, err := adi.Init(ctxT(t), opts...)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Init: %v, want an error naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer w.Finalize(ctxT(t))
			if got := w.AppNum(); got != tc.want {
				t.Fatalf("AppNum() = %d, want %d", got, tc.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
