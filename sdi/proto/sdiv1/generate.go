// Package sdiv1 holds the generated code for the SDI plugin protocol,
// version 1 (sdi.proto). Only sdi/plugin uses it; the rest of the module
// sees Go types from package sdi.
package sdiv1

// Regenerate with protoc (Debian: protobuf-compiler) and the pinned plugins:
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.11
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.1
//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative sdi.proto
