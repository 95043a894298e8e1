module numalign.local/images

go 1.26
