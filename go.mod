module github.com/rxego/rxego

go 1.26
