//go:build !amd64 || purego

package icrc

// hasWide is false: foldWide has no implementation here.
var hasWide = false

// foldWide is never called where hasWide is false.
func foldWide(s uint32, p []byte) uint32 { panic("icrc: foldWide without hasWide") }
