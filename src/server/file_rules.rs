//! Which fields each file operation takes, and their bounds (store §5.1). Anything else is
//! INVALID_ARGUMENT before any state is read.

use crate::api::pb::FileRequest;
use crate::executor::protocol::{MAX_FILE_BYTES, MAX_LIST_ENTRIES, MAX_PATH_BYTES, Operation};

/// A file request whose fields do not fit its operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("file request fields do not fit the operation or exceed a bound")]
pub struct MalformedFileRequest;

/// Checks the field matrix and bounds of a file request.
pub fn check(operation: &Operation, r: &FileRequest) -> Result<(), MalformedFileRequest> {
    let bounded = r.data.len() <= MAX_FILE_BYTES
        && r.path.len() <= MAX_PATH_BYTES
        && r.destination.len() <= MAX_PATH_BYTES
        && r.pattern.len() <= MAX_PATH_BYTES
        && (0..=MAX_LIST_ENTRIES as i64).contains(&i64::from(r.limit));
    let (path, destination, pattern, data, version, limit) = (
        !r.path.is_empty(),
        !r.destination.is_empty(),
        !r.pattern.is_empty(),
        !r.data.is_empty(),
        !r.version.is_empty(),
        r.limit != 0,
    );
    let shape = match operation {
        Operation::FileRead
        | Operation::FileResolveAuthority
        | Operation::FileStat
        | Operation::FileRemove => path && !destination && !pattern && !data && !version && !limit,
        Operation::FileCreate => path && !destination && !pattern && !version && !limit,
        Operation::FileReplace => path && version && !destination && !pattern && !limit,
        Operation::FileList => !destination && !pattern && !data && !version,
        Operation::FileRename | Operation::FileCopy => {
            path && destination && !pattern && !data && !version && !limit
        }
        Operation::FileGlob => pattern && !path && !destination && !data && !version,
        Operation::FileGrep => pattern && !destination && !data && !version,
        _ => false,
    };
    if bounded && shape {
        Ok(())
    } else {
        Err(MalformedFileRequest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str, data: &[u8], version: &[u8]) -> FileRequest {
        FileRequest {
            path: path.into(),
            data: data.to_vec(),
            version: version.to_vec(),
            ..FileRequest::default()
        }
    }

    #[test]
    fn each_operation_takes_only_its_fields() {
        assert!(check(&Operation::FileRead, &req("a", b"", b"")).is_ok());
        assert!(check(&Operation::FileRead, &req("", b"", b"")).is_err());
        assert!(check(&Operation::FileRead, &req("a", b"x", b"")).is_err());
        assert!(check(&Operation::FileCreate, &req("a", b"x", b"")).is_ok());
        assert!(check(&Operation::FileReplace, &req("a", b"x", b"")).is_err());
        assert!(check(&Operation::FileReplace, &req("a", b"x", b"v")).is_ok());
        assert!(check(&Operation::CommandStart, &req("a", b"", b"")).is_err());
    }

    #[test]
    fn oversize_fields_are_refused() {
        let long = "a".repeat(MAX_PATH_BYTES + 1);
        assert!(check(&Operation::FileRead, &req(&long, b"", b"")).is_err());
        let mut list = req("", b"", b"");
        list.limit = -1;
        assert!(check(&Operation::FileList, &list).is_err());
    }
}
