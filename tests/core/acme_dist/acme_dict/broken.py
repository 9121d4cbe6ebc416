raise ImportError("libacme.so: cannot open shared object file")
