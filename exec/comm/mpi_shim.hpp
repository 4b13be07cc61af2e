// The C interface of libtwin_mpi_shim.so, the only code that links MPI.
//
// Why a shim: the `twin` binary also links SimGrid, whose SMPI exports the whole MPI API (MPI_Init, MPI_Isend...). In
// one process the dynamic linker binds those names to whichever library comes first, and that is SimGrid. So the MPI
// communicator never calls MPI directly: it dlopen()s this shim, which calls every MPI function through a pointer
// looked up in the MPI library itself (dlsym on that library's handle), whatever else the process has loaded.
// Requests are opaque handles owned by the shim; every function returns an MPI error code (0: success).
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

typedef struct TwinMpiApi {
  int (*init)(int* rank, int* size);  // MPI_Init_thread (funneled) unless initialised, dup of MPI_COMM_WORLD
  int (*finalize)(void);              // frees the communicator; MPI_Finalize if init() initialised MPI
  int (*isend)(const void* data, int bytes, int peer, int tag, void** request);
  int (*irecv)(void* data, int bytes, int peer, int tag, void** request);
  int (*test)(void** request, int* done);  // frees the request when done
  int (*cancel)(void** request);           // cancels and frees a pending request
  int (*iprobe)(int peer, int tag, int* found, int* bytes);
  int (*recv)(void* data, int bytes, int peer, int tag);
  void (*abort)(int code);
  void (*error_string)(int code, char* text, int capacity);
  int tag_upper_bound;  // MPI_TAG_UB (after init)
} TwinMpiApi;

// Fills the table; the only exported symbol.
void twin_mpi_shim_api(TwinMpiApi* api);

#ifdef __cplusplus
}
#endif
