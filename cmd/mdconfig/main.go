// Command mdconfig turns an HCL description of a network into per-host
// connection tables, checks descriptions, explains routes and draws the
// graph. See package mdconfig for the description format.
package main

import "os"

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }
