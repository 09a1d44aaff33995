module github.com/rxego/rxego

go 1.26

require (
	github.com/gopacket/gopacket v1.7.7 // indirect
	golang.org/x/net v0.55.0 // indirect
	golang.org/x/sys v0.45.0 // indirect
)
