package shmem

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func TestValidName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"mdshm.abc.r0.ff", true},
		{"a-b_c", true},
		{"", false},
		{".hidden", false},
		{"../etc/passwd", false},
		{"a/b", false},
		{"a\x00b", false},
		{string(make([]byte, MaxNameLen+1)), false},
	}
	for _, tt := range tests {
		if err := ValidName(tt.name); (err == nil) != tt.ok {
			t.Errorf("ValidName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

func TestCreateOpenShareAndUnlink(t *testing.T) {
	name := fmt.Sprintf("shmem-test-%d", os.Getpid())
	a, err := Create(name, 8192)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if _, err := Create(name, 8192); err == nil {
		t.Fatal("second Create of the same name succeeded")
	}
	b, err := Open(name)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if len(b.Bytes()) != 8192 {
		t.Fatalf("Open mapped %d bytes, want 8192", len(b.Bytes()))
	}
	a.Bytes()[4000] = 42
	if got := b.Bytes()[4000]; got != 42 {
		t.Fatalf("byte written through one mapping reads %d through the other", got)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close opener: %v", err)
	}
	if _, err := os.Stat(filepath.Join(Dir, name)); err != nil {
		t.Fatalf("opener's Close removed the file: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close creator: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Stat(filepath.Join(Dir, name)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("creator's Close left the file: %v", err)
	}
}

func TestOpenMissing(t *testing.T) {
	if _, err := Open("shmem-test-does-not-exist"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open missing = %v, want ErrNotExist", err)
	}
}
